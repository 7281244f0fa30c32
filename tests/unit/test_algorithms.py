"""The seam between the cluster and its algorithms (a3c_http/algos/base.py): each algo has its
algorithm, which decides what a worker does with a rollout and what the master does with a push,
through ports that fakes stand in for here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from a3c_http.algos.a2c.algorithm import SyncA2C
from a3c_http.algos.a3c.algorithm import A3C
from a3c_http.algos.apex.algorithm import ApexActor
from a3c_http.algos.base import GradientUpdate, Sends
from a3c_http.algos.best_weights.algorithm import BestWeights
from a3c_http.algos.dqn.algorithm import AsyncDQN
from a3c_http.algos.impala.algorithm import Impala
from a3c_http.algos.ppo.algorithm import PPO
from a3c_http.algos.registry import (
    CONFIGS,
    SECTIONS,
    algorithm_class,
    algorithm_for,
    model_for,
    train_config,
)
from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import Episode, Rollout, RolloutCollector


class FakePort:
    """A worker's port that records what the algorithm asked of it."""

    def __init__(self, improved: bool = False) -> None:
        self.improved = improved
        self.calls: list[tuple[str, Any]] = []
        self.metrics: dict[str, float] = {}

    def push_gradients(self, update: GradientUpdate, rollout: Rollout, wait_s: float) -> None:
        self.calls.append(("push_gradients", (update, wait_s)))

    def report_episodes(self, episodes: list[Episode]) -> bool:
        self.calls.append(("report_episodes", len(episodes)))
        return self.improved

    def push_weights(self, temporary: bool) -> None:
        self.calls.append(("push_weights", temporary))

    def push_experience(self, rollout: Rollout) -> None:
        self.calls.append(("push_experience", rollout))

    def pull_weights(self) -> None:
        self.calls.append(("pull_weights", None))

    @contextlib.contextmanager
    def learning(self) -> Iterator[None]:
        self.calls.append(("learning", None))
        yield

    def note_metrics(self, metrics: dict[str, float]) -> None:
        self.metrics.update(metrics)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class FakeServer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def apply_gradients(self, update: Any, config: TrainConfig, refusal: Any) -> str:
        self.calls.append(("apply_gradients", update))
        return "applied"

    def join_round(self, update: Any, config: TrainConfig, refusal: Any, expected: set[str]):
        self.calls.append(("join_round", expected))
        return "joined"


def one_rollout(config: TrainConfig, model: torch.nn.Module) -> Rollout:
    collector = RolloutCollector.for_config(config, seed=0)
    try:
        return collector.collect(model, config.t_max)
    finally:
        collector.close()


@pytest.mark.parametrize(
    ("algo", "cls", "sends"),
    [
        ("a3c", A3C, Sends.GRADIENTS),
        ("a2c", SyncA2C, Sends.GRADIENTS),
        ("best_weights", BestWeights, Sends.WEIGHTS),
        ("ppo", PPO, Sends.EXPERIENCE),
        ("impala", Impala, Sends.EXPERIENCE),
        ("dqn", AsyncDQN, Sends.GRADIENTS),
        ("apex", ApexActor, Sends.EXPERIENCE),
    ],
)
def test_each_algo_names_its_section_and_its_algorithm(algo: str, cls: type, sends: Sends) -> None:
    """The registry's one line per algorithm: the section of `algo` names the class whose
    `name` is that algo, and its workers build it."""
    config = train_config(algo=algo)
    assert type(config) is CONFIGS[algo] and config.algo == algo == cls.name
    assert algorithm_class(config) is cls and cls.sends is sends
    if sends is not Sends.EXPERIENCE:  # an actor of a learner: the learner's tests
        assert type(algorithm_for(config, model_for(config), None)) is cls


def test_the_registry_holds_every_algorithm_once() -> None:
    assert list(CONFIGS) == [section.model_fields["algo"].default for section in SECTIONS]
    assert len(set(CONFIGS)) == len(SECTIONS)
    assert set(CONFIGS) == {
        "a3c", "a2c", "best_weights", "ppo", "impala", "dqn", "apex", "apex_dpg", "sac",
    }


def test_a3c_pushes_the_clipped_gradients_of_the_policy_that_acted_without_waiting() -> None:
    config = train_config(max_in_flight=3, max_staleness=2, max_grad_norm=0.01)
    model = model_for(config)
    algorithm = algorithm_for(config, model, model)
    assert algorithm.pushes_in_flight() == 2  # never more than would be refused as stale
    port = FakePort()
    algorithm.on_rollout(port, one_rollout(config, model))
    assert port.names() == ["learning", "push_gradients"]
    update, wait_s = port.calls[1][1]
    assert wait_s == 0.0
    assert set(update.gradients) == {name for name, _ in model.named_parameters()}
    clipped = torch.linalg.vector_norm(torch.cat([g.flatten() for g in update.gradients.values()]))
    assert update.norm > 0.01 and clipped.item() == pytest.approx(0.01, rel=1e-4)
    assert "train/policy_loss" in update.metrics and update.loss == pytest.approx(
        update.metrics["train/loss"], rel=1e-5
    )


def test_sync_waits_for_its_round_and_a3c_steps_at_once_on_the_master() -> None:
    config = train_config(algo="a2c", sync_timeout_s=7.0)
    sync = algorithm_for(config, model_for(config), None)
    assert sync.pushes_in_flight() == 0 and sync.push_wait_s() == 7.0
    server, asked = FakeServer(), []

    def expected() -> set[str]:
        asked.append(True)
        return {"w1", "w2"}

    assert SyncA2C.apply(server, "u", config, None, expected) == "joined"
    assert server.calls == [("join_round", {"w1", "w2"})]
    server.calls.clear()
    asked.clear()
    assert A3C.apply(server, "u", train_config(), None, expected) == "applied"
    assert server.calls == [("apply_gradients", "u")] and not asked  # no round to wait for


@pytest.mark.parametrize("improved", [False, True])
def test_best_weights_learns_on_its_own_and_sends_its_weights_after_a_record(
    improved: bool,
) -> None:
    config = train_config(algo="best_weights", t_max=20)
    model = model_for(config)
    algorithm = algorithm_for(config, model, model)
    before = [p.detach().clone() for p in model.parameters()]
    port = FakePort(improved=improved)
    algorithm.on_rollout(port, one_rollout(config, model))
    expected = ["report_episodes", *(["push_weights"] if improved else []), "learning"]
    assert port.names() == expected
    if improved:
        assert port.calls[1] == ("push_weights", False)  # as the new global weights
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert "train/value_loss" in port.metrics
    port.calls.clear()
    algorithm.on_heartbeat(port)
    assert port.calls == [("push_weights", True), ("pull_weights", None)]


@pytest.mark.parametrize(("algo", "cls"), [("ppo", PPO), ("impala", Impala)])
def test_a_learners_workers_only_act_and_push_the_rollout(algo: str, cls: type) -> None:
    """No loss and no backward pass on the worker: the rollout goes to the learner as it is,
    with one push in flight at most, none with max_in_flight 0."""
    config = train_config(algo=algo, num_envs=2, t_max=4, max_in_flight=8)
    model = model_for(config)
    algorithm = algorithm_for(config, model, model)
    assert type(algorithm) is cls and cls.sends is Sends.EXPERIENCE
    assert algorithm.pushes_in_flight() == 1
    assert algorithm_for(config.model_copy(update={"max_in_flight": 0}), model, model)\
        .pushes_in_flight() == 0  # fmt: skip
    port = FakePort()
    rollout = one_rollout(config, model)
    algorithm.on_rollout(port, rollout)
    assert port.calls == [("push_experience", rollout)]
    assert all(p.grad is None for p in model.parameters())


class TargetPort(FakePort):
    """A dqn worker's port: weights of `version`, the master's target network of
    `target_version` (as one vector of the given weights)."""

    def __init__(self, vector: torch.Tensor) -> None:
        super().__init__()
        self.version = 0
        self.target_version = 0
        self.vector = vector

    def target_weights(self, if_not_version: int | None) -> Any:
        self.calls.append(("target_weights", if_not_version))
        if if_not_version == self.target_version:
            return None
        return SimpleNamespace(vector=self.vector, version=self.target_version)


def test_a_dqn_worker_fills_its_replay_then_pushes_against_the_masters_target() -> None:
    config = train_config(
        algo="dqn", hidden_sizes=[8], num_envs=2, t_max=8, learning_starts=20,
        gradient_steps=3, target_update=10, exploration_steps=32,
    )  # fmt: skip
    model = model_for(config)
    target = torch.full((sum(p.numel() for p in model.parameters()),), 0.5)
    port = TargetPort(target)
    algorithm = algorithm_for(config, model, model)
    assert algorithm.sends is Sends.GRADIENTS and algorithm.pushes_in_flight() == 0
    first = one_rollout(config, algorithm.policy)
    algorithm.on_rollout(port, first)  # at most 16 transitions: too few
    assert "push_gradients" not in port.names() and "report_episodes" in port.names()
    drop = (1 - config.exploration_final_eps) * first.num_steps / 32
    assert algorithm.policy.epsilon == pytest.approx(1 - drop)
    port.calls.clear()
    algorithm.on_rollout(port, one_rollout(config, algorithm.policy))
    assert port.names().count("push_gradients") == 3 and "report_episodes" not in port.names()
    assert ("target_weights", None) in port.calls  # the first target it holds
    assert all(float(p.detach().flatten()[0]) == 0.5 for p in algorithm.target.parameters())
    pushes = [c[1][0] for c in port.calls if c[0] == "push_gradients"]
    assert set(pushes[0].gradients) == {n for n, _ in model.named_parameters()}
    port.calls.clear()
    port.version = 9  # not yet target_update versions past the target it holds: not asked
    algorithm.on_rollout(port, one_rollout(config, algorithm.policy))
    assert "target_weights" not in port.names()
    port.version, port.target_version = 10, 10
    algorithm.on_rollout(port, one_rollout(config, algorithm.policy))
    assert ("target_weights", 0) in port.calls and algorithm.target_version == 10
