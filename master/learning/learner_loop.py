"""The learner process beside the master (`algo` ppo, impala and apex): what runs in it, started by
master/learning/learner_process.py `LearnerProcess` from a `Start`, and the `Publication` it sends
after each update.

The learner process (`learner_main`) keeps the rollouts it took in arrival order; one more than
`max_policy_lag` versions older than its weights is dropped and counted. When `queue_size` are
there it learns (a3c_http/algos/learner.py `Learner.learn`; an update that only filled a
replay publishes no version). It ends when told to, when the master's process is gone, or on an
error, which it reports: the master then starts it again from the newest weights it published
(master/learner_runs.py), and ends the run only after MAX_FAILURES_IN_A_ROW failures with no update
between them. A kill or a failure loses the queue (and Ape-X's replay), never the weights,
optimizer state, target network or counters of the last save.

With `learners` N the process leads a team of N (a3c_http/optim/team.py): before each update it
tells the others (master/learning/learner_team.py `follower_main`) which slots the update takes
(`Plan`), and each learns from its share of them, the gradients averaged over the team at every
step. It alone talks to the master; a learner of the team that ends ends the team's collectives,
and the master starts the whole team again.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from a3c_http.algos.learner import Learner
from a3c_http.algos.registry import algorithm_class, config_json, model_for
from a3c_http.config.training import TrainConfig
from a3c_http.optim.team import LEARN, SOLO, STOP, Plan, ProcessTeam, Team, TeamSpec
from a3c_http.wire.tensors import Layout

log = logging.getLogger("a3c.master")


@dataclass
class Publication:
    """What the learner sends after an update: its version, whether its weights changed (the
    newest are in the vector it shares with the master, with their version: the master takes
    both from there), the optimizer's state (or None: not this time), the update's metrics,
    and how many rollouts it used and dropped since its last message."""

    version: int
    changed: bool
    optimizer_state: dict[str, Any] | None
    metrics: dict[str, float] = field(default_factory=dict)
    used: int = 0
    dropped: int = 0
    nonfinite_steps: int = 0
    # A new target network (Ape-X's learner): a float32 vector (numpy between the processes),
    # and the update's version.
    target: tuple[Any, int] | None = None
    freed: list[int] = field(default_factory=list)  # the slots of the rollouts used or dropped



@dataclass
class Start:
    """What a learner process starts from (its fields: the run's config as JSON, ...), where it
    learns, how often it sends the optimizer's state, and a resumed run's target network."""

    config_json: str
    weights: torch.Tensor
    optimizer_state: dict[str, Any] | None
    version: int
    device: str
    optimizer_every_s: float
    target: tuple[torch.Tensor, int] | None = None
    slots: dict[str, torch.Tensor] = field(default_factory=dict)  # shared with the master
    version_value: Any = None  # the shared version of `weights` (shared too), and their lock
    lock: Any = None
    # This learner's place in a team of `learners` (a3c_http/optim/team.py); None: alone.
    team: TeamSpec | None = None


class PeerGone(Exception):
    """The other process of a `holding` lock ended while the lock was held: by it, perhaps."""


@contextlib.contextmanager
def holding(lock: Any, peer_alive: Callable[[], bool], poll_s: float = 1.0) -> Iterator[None]:
    """Hold `lock`, a lock between this process and one other (the shared weights' `Start.lock`),
    for the block. A process killed while it holds such a lock never releases it, so the wait
    looks at the other process every `poll_s` seconds and raises PeerGone once it has ended
    (whatever it wrote under the lock may be half written) instead of waiting for ever."""
    while not lock.acquire(timeout=poll_s):
        if not peer_alive():
            raise PeerGone
    try:
        yield
    finally:
        lock.release()


def learner_main(start: Start, inbox: Any, outbox: Any) -> None:
    """The learner process (see the module's docstring)."""
    team: Team = SOLO
    try:
        config, learner, team = build_learner(start)
        _learn(start, config, learner, team, inbox, outbox)
    except PeerGone:  # the master died holding the weights' lock (kill -9): as in _learn's loop
        outbox.cancel_join_thread()
    except Exception as exc:  # reported to the master, which ends the run with it
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        log.error("learner failed:\n%s", traceback.format_exc())
        outbox.put(("error", detail))
    finally:
        team.close()


def build_learner(start: Start) -> tuple[TrainConfig, Learner, Team]:
    """The learner a process builds from its Start, in its team (joined here: this waits for
    every learner of the team) where it has one."""
    config = config_json(start.config_json)
    spec = start.team or TeamSpec(0, 1)
    device = torch.device(start.device)
    if device.type == "cuda" and device.index is None and spec.size > 1:
        device = torch.device("cuda", spec.rank % max(torch.cuda.device_count(), 1))
    if device.type == "cpu":  # half the cores (the rest for workers on this host), or as told
        cores = os.cpu_count() or 2
        wanted = config.learner_threads or max(1, min(4, cores // 2))
        torch.set_num_threads(max(1, min(wanted, cores) // spec.size))  # shared by the team
    team = ProcessTeam(spec, device) if spec.size > 1 else SOLO
    model = model_for(config)
    model.load_state_dict(Layout.of(model).views(start.weights))
    learner = algorithm_class(config).learner(
        config, model, device, start.optimizer_state, team=team
    )
    if start.target is not None:
        learner.restore_target(start.target[0])
    return config, learner, team


def _learn(
    start: Start, config: TrainConfig, learner: Learner, team: Team, inbox: Any, outbox: Any
) -> None:
    version, optimizer_every_s = start.version, start.optimizer_every_s
    plan = Plan(config.queue_size)
    outbox.put(("ready",))
    parent = multiprocessing.parent_process()
    master_alive = parent.is_alive if parent is not None else lambda: True

    def share(version: int) -> None:  # the newest weights, for the master to read
        with holding(start.lock, master_alive):
            learner.copy_weights(start.weights)
            start.version_value.value = version

    # The rollouts taken: their slot, tensors (views of the slot), version and env steps.
    pending: list[tuple[int, dict[str, torch.Tensor], int, int]] = []
    last_optimizer = time.monotonic()
    freed: list[int] = []  # the slots of rollouts dropped since the last message
    dropped = 0
    while True:
        try:
            message = inbox.get(timeout=1.0)
        except queue.Empty:
            if not master_alive():
                # The master is gone (kill -9): nothing reads what is still buffered, which the
                # queue would otherwise wait to write at exit, for ever.
                outbox.cancel_join_thread()
                return
            continue
        if message[0] == "stop":
            plan.tell(team, STOP)
            share(version)
            outbox.put(("publication", Publication(
                version, True, learner.optimizer_state(), {}, 0, dropped, freed=freed,
            )))  # fmt: skip
            outbox.put(("stopped",))
            return
        _, slot, policy_version, env_steps = message
        tensors = {name: rows[slot] for name, rows in start.slots.items()}
        pending.append((slot, tensors, policy_version, env_steps))
        stale = [p for p in pending if version - p[2] > config.max_policy_lag]
        if stale:
            pending = [p for p in pending if version - p[2] <= config.max_policy_lag]
            dropped += len(stale)
            freed += [p[0] for p in stale]
        if len(pending) < config.queue_size:
            if dropped:
                outbox.put(("publication", Publication(
                    version, False, None, {}, 0, dropped, freed=freed,
                )))  # fmt: skip
                dropped, freed = 0, []
            continue
        batch, pending = pending[: config.queue_size], pending[config.queue_size :]
        undone = learner.nonfinite_steps
        env_steps = max(p[3] for p in batch)
        plan.tell(team, LEARN, [p[0] for p in batch], env_steps)
        metrics = learner.learn([p[1] for p in batch], env_steps)
        team.agree(0)  # every learner is done with the slots
        freed += [p[0] for p in batch]  # learnt from: the learner keeps nothing of the slots
        if metrics is None:  # taken, the weights unchanged (a replay still filling)
            outbox.put(("publication", Publication(
                version, False, None, {}, len(batch), dropped, freed=freed,
            )))  # fmt: skip
            dropped, freed = 0, []
            continue
        version += 1
        share(version)
        target = learner.take_target()
        send_optimizer = time.monotonic() - last_optimizer >= optimizer_every_s
        last_optimizer = time.monotonic() if send_optimizer else last_optimizer
        outbox.put(("publication", Publication(
            version, True,
            learner.optimizer_state() if send_optimizer else None,
            metrics, len(batch), dropped, learner.nonfinite_steps - undone,
            None if target is None else (target.numpy(), version),  # taken by this version
            freed=freed,
        )))  # fmt: skip
        dropped, freed = 0, []
