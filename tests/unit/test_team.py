"""Data-parallel learners (a3c_http/optim/team.py) with tensors alone: learners of a team, each on
its share of an update's rollouts, take the step one learner takes on all of them, and stay
equal where their shares differ. The team here joins threads; the processes' team over
torch.distributed is shown in tests/service/test_learner_team.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from a3c_http.algos.registry import algorithm_class, model_for, train_config
from a3c_http.optim.team import Team
from tests.unit.test_learners import _crafted

TWO = 2


def experience(cfg: Any, seed: int) -> dict[str, torch.Tensor]:
    """A rollout of `cfg`'s shapes, every step valid, its observations, rewards and actions
    drawn from `seed`."""
    tensors = _crafted(cfg)
    draw = torch.Generator().manual_seed(seed)
    tensors["obs"].normal_(generator=draw)
    tensors["rewards"].uniform_(generator=draw)
    tensors["actions"].random_(0, 2, generator=draw)
    return tensors


class ThreadTeam(Team):
    """A team of learners in threads of one process: what they exchange meets at a barrier."""

    def __init__(self, rank: int, shared: dict[str, Any]) -> None:
        self.rank, self.size, self._shared = rank, TWO, shared

    def _gather(self, value: Any) -> list[Any]:
        values, barrier = self._shared["values"], self._shared["barrier"]
        values[self.rank] = value
        barrier.wait()
        seen = list(values)
        barrier.wait()  # every learner has read them before any writes the next
        return seen

    def average(self, tensor: torch.Tensor) -> None:
        tensor.copy_(torch.stack(self._gather(tensor.clone())).mean(0))

    def agree(self, value: int, how: str = "max") -> int:
        return {"max": max, "min": min}[how](self._gather(value))


def as_team(make: Callable[[Team], Any], rollouts: list[dict], env_steps: int = 100) -> list[Any]:
    """Two learners made by `make` (given their team), each learning from `rollouts` in a
    thread of its own; the learners, once both are done."""
    shared = {"values": [None] * TWO, "barrier": threading.Barrier(TWO, timeout=30)}
    learners = [make(ThreadTeam(rank, shared)) for rank in range(TWO)]
    failures: list[BaseException] = []

    def run(learner: Any) -> None:
        try:
            learner.learn(rollouts, env_steps)
        except BaseException as exc:  # shown by the test, not lost in the thread
            failures.append(exc)
            shared["barrier"].abort()

    threads = [threading.Thread(target=run, args=(learner,)) for learner in learners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures and not any(t.is_alive() for t in threads), failures
    return learners


def test_a_team_of_two_takes_the_step_one_learner_takes_on_both_shares() -> None:
    """IMPALA, one step on the whole batch: the mean of two shares' gradients (each share's loss
    a mean over as many steps) is the whole batch's, so the team ends where one learner does.
    The shares are halves of the update's environments: here one rollout's are cut between
    them."""
    cfg = train_config(algo="impala", num_envs=2, t_max=8, queue_size=3, learners=2, seed=1,
                       n_epochs=1, minibatches=1)  # fmt: skip
    torch.manual_seed(0)
    start = model_for(cfg).state_dict()
    rollouts = [experience(cfg, seed=s) for s in range(3)]

    def make(team: Team | None = None) -> Any:
        model = model_for(cfg)
        model.load_state_dict(start)
        joined = {"team": team} if team is not None else {}
        return algorithm_class(cfg).learner(cfg, model, torch.device("cpu"), **joined)

    alone = make()
    alone.learn(rollouts, 100)
    team = as_team(make, rollouts)
    assert torch.equal(team[0].net.flat, team[1].net.flat)
    assert not torch.equal(team[0].net.flat, make().net.flat)  # it learnt
    torch.testing.assert_close(team[0].net.flat, alone.net.flat, rtol=1e-5, atol=1e-6)


def test_learners_whose_shares_differ_take_as_many_steps_and_stay_equal() -> None:
    """PPO with shares of unequal valid steps (one learner has more minibatches of its own) and
    Ape-X with replay shards filled unequally: every learner takes the team's number of steps,
    and all end with the same weights."""
    ppo = train_config(algo="ppo", num_envs=2, t_max=8, queue_size=2, learners=2, seed=1,
                       batch_size=8, n_epochs=2)  # fmt: skip
    apex = train_config(algo="apex", num_envs=2, t_max=8, queue_size=2, learners=2, seed=1,
                        batch_size=8, learning_starts=12, gradient_steps=3)  # fmt: skip
    for cfg in (ppo, apex):
        rollouts = [experience(cfg, seed=s) for s in range(2)]
        rollouts[1]["valid"][4:] = False  # the second share: half the first's steps
        torch.manual_seed(0)
        start = model_for(cfg).state_dict()

        def make(team: Team, cfg: Any = cfg, start: dict = start) -> Any:
            model = model_for(cfg)
            model.load_state_dict(start)
            return algorithm_class(cfg).learner(cfg, model, torch.device("cpu"), team=team)

        team = as_team(make, rollouts)
        assert torch.equal(team[0].net.flat, team[1].net.flat), cfg.algo
        assert team[0].updates == team[1].updates == 1, cfg.algo
        if cfg.algo == "apex":  # the shards: each past its half of learning_starts
            assert [len(learner.replay) for learner in team] == [16, 8]
            assert team[0].steps == team[1].steps == 3


def test_a_team_that_cannot_share_an_update_is_refused_naming_why() -> None:
    with pytest.raises(ValidationError, match="learners 3 is more than the 2 environments"):
        train_config(algo="ppo", num_envs=1, queue_size=2, learners=3)
    with pytest.raises(ValidationError, match="minibatches 5 is more than the 4 environments"):
        train_config(algo="impala", num_envs=2, queue_size=4, learners=2, minibatches=5)
    # sac's and apex_dpg's optimizers of their own are not averaged: one learner
    with pytest.raises(ValidationError, match="learners"):
        train_config(algo="sac", env_id="Pendulum-v1", learners=2)
