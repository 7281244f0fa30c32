"""A team of learner processes beside the master (`learners` N, a3c_http/optim/team.py): how the
master starts them (`start_team`: the first, which it talks to, and N-1 that the first leads,
each joined at a rendezvous port of the first's, as torchrun starts its ranks), what those N-1
run (`follower_main`), and how they end (`end_team`)."""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from typing import Any

from a3c_http.optim.team import SOLO, STOP, Plan, Team, TeamSpec, rendezvous_port
from master.learning.learner_loop import Start, build_learner, learner_main

log = logging.getLogger("a3c.master")


def start_team(
    context: Any, start: Start, learners: int, inbox: Any, outbox: Any
) -> tuple[Any, list[Any]]:
    """The processes of a learner team of `learners` from `start` (not started): the first
    learner, reading `inbox` and writing `outbox`, and the others it leads (none for one)."""
    port = rendezvous_port() if learners > 1 else 0
    team = [TeamSpec(rank, learners, "127.0.0.1", port) for rank in range(learners)] if port else []
    first = context.Process(
        target=learner_main,
        args=(dataclasses.replace(start, team=team[0] if team else None), inbox, outbox),
        name="a3c-learner",
        daemon=True,
    )
    followers = [
        context.Process(
            target=follower_main,
            args=(dataclasses.replace(start, team=spec),),
            name=f"a3c-learner-{spec.rank}",
            daemon=True,
        )
        for spec in team[1:]
    ]
    return first, followers


def team_ended(first: Any, followers: list[Any]) -> str | None:
    """Why a team is over where one of its processes has ended, else None."""
    for rank, process in enumerate([first, *followers]):
        if not process.is_alive():
            who = "the learner process" if rank == 0 else f"learner {rank} of its team"
            return f"{who} ended (exit code {process.exitcode})"
    return None


def team_pids(first: Any, followers: list[Any]) -> str:
    """The team's processes, for the log: "pid 12" or "pid 12 with 2 more (pids 13, 14)"."""
    more = ", ".join(str(f.pid) for f in followers)
    return f"pid {first.pid}" + (f" with {len(followers)} more (pids {more})" if more else "")


def end_team(processes: list[Any], wait_s: float) -> None:
    """End a team's processes: each waited for up to `wait_s` (they end once their first
    learner stopped or failed), then killed."""
    deadline = time.monotonic() + wait_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(5)


def follower_main(start: Start) -> None:
    """A learner of rank 1 or more in a team (a3c_http/optim/team.py): it learns from the
    rollouts its first learner names, in the slots they share, until told to stop; it ends on
    an error, or when the first learner is gone (a collective then fails), which the first
    learner's master sees and starts the team again."""
    team: Team = SOLO
    try:
        config, learner, team = build_learner(start)
        plan = Plan(config.queue_size)
        while True:
            command, slots, env_steps = plan.hear(team)
            if command == STOP:
                return
            learner.learn([{n: rows[s] for n, rows in start.slots.items()} for s in slots],
                          env_steps)  # fmt: skip
            team.agree(0)  # done with the slots: the first learner frees them after this
    except Exception:  # its team's first learner fails too, and reports it
        log.error("learner %s failed:\n%s", start.team, traceback.format_exc())
        raise SystemExit(1) from None
    finally:
        team.close()
