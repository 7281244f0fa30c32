"""Evaluation of the global network while it trains: the episodes of
a3c_http/policy/evaluation.py, the master's evaluator (master/background/evaluator.py) with a
stand-in for its child process, and once through the app with its real evaluation process: /status,
the run folder, a restart."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import load as st_load

from a3c_http.algos.base import Sends
from a3c_http.algos.registry import model_for, train_config
from a3c_http.config.settings import Settings
from a3c_http.config.training import TrainConfig
from a3c_http.local.cluster import wait_for
from a3c_http.policy import evaluation
from a3c_http.policy.evaluation import EvalResult, evaluate
from a3c_http.store.runstore import RunStore
from a3c_http.testing.standin import StandInWorker
from a3c_http.wire import tensors as wire
from master.app import create_app
from master.background import evaluator as evaluator_module
from master.state import ClusterState
from tests.support.common import AUTH, OCTET, STAND_IN_RUN, TOKEN
from tests.support.log_capture import CapturedEvents

PAYOUT = "tests.support.envs:Payout-v0"
WORKERS = ["http://127.0.0.1:9"]
CONFIG = train_config(seed=1, max_steps=None, eval_every_updates=1, eval_episodes=2)
EVAL_FIELDS = (
    "evaluations",
    "eval_mean_return",
    "eval_std_return",
    "eval_mean_length",
    "eval_episodes",
    "eval_model_version",
    "eval_elapsed_s",
    "eval_global_steps",
    "eval_error",
)


@pytest.fixture
def test_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A3C_ENV_MODULES", "tests.support.envs")


def weights_with_policy_bias(config: TrainConfig, bias: list[float]) -> bytes:
    """Weights whose played action is known: every parameter zero but the policy head's bias, so
    the logits (or the Gaussian's mean) are `bias` whatever the observation, and a Gaussian's
    log-std, so narrow that its draws are its mean."""
    model = model_for(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.policy_head.bias.copy_(torch.tensor(bias))
        if hasattr(model, "log_std"):
            model.log_std.fill_(-20.0)
    return wire.encode(model.state_dict())


# -- the episodes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("continuous", "bias", "expected"),
    [
        # the action drawn, 1 (all but certain), pays 1 at each of the 5 steps
        (False, [-20.0, 20.0], 5.0),
        (False, [20.0, -20.0], 0.0),
        (True, [3.0], 5.0),  # the mean 3.0 is clipped to the Box's 1.0 (3.0 would pay 15)
        (True, [-3.0], -5.0),
    ],
)
def test_the_played_action_earns_a_known_return(
    test_envs: None, continuous: bool, bias: list[float], expected: float
) -> None:
    config = train_config(
        env_id=PAYOUT, env_kwargs={"continuous": continuous}, seed=1, eval_episodes=3
    )
    result = evaluate(config, weights_with_policy_bias(config, bias))
    assert result == EvalResult(expected, 0.0, 3, 5.0, (expected,) * 3)


def test_an_episode_that_never_ends_is_cut(
    test_envs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evaluation, "MAX_EPISODE_STEPS", 7)
    config = train_config(env_id=PAYOUT, env_kwargs={"length": None}, seed=1, eval_episodes=2)
    result = evaluate(config, weights_with_policy_bias(config, [-20.0, 20.0]))
    assert (result.mean_length, result.mean_return) == (7.0, 7.0)


def test_an_evaluation_depends_on_the_weights_and_the_seed_only() -> None:
    # More episodes than environments played at once: some environments play two.
    config = train_config(seed=5, eval_episodes=evaluation.MAX_PARALLEL_ENVS + 4)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        weights = wire.encode(model_for(config).state_dict())
    first = evaluate(config, weights)
    assert first.episodes == len(first.returns) == config.eval_episodes
    assert evaluate(config, weights) == first
    # Episode i starts alike whichever environment plays it and however many are played.
    assert evaluate(config, weights, episodes=3).returns == first.returns[:3]
    assert evaluate(config.model_copy(update={"seed": 6}), weights).returns != first.returns


# -- the master's evaluator, with a stand-in child -------------------------------------------------


def ok(mean_return: float) -> tuple[str, EvalResult]:
    """The reply of an evaluation of two episodes whose mean is `mean_return`."""
    returns = (mean_return - 1.5, mean_return + 1.5)
    return "ok", EvalResult(mean_return, 1.5, 2, mean_return, returns)


class StandInChild:
    """Plays the evaluation process in this process: answers each evaluation with the next reply
    of `script` (an exception there is raised, as the pipe of an ended process does), and keeps
    what it was sent."""

    script: list[Any] = []
    made: list[StandInChild] = []

    def __init__(self) -> None:
        self.played: list[tuple[TrainConfig, bytes]] = []
        self.closed = False
        StandInChild.made.append(self)

    def play(self, config: TrainConfig, weights: bytes, stop: Any) -> Any:
        self.played.append((config, weights))
        reply = StandInChild.script.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def child(monkeypatch: pytest.MonkeyPatch) -> type[StandInChild]:
    monkeypatch.setattr(evaluator_module, "_Child", StandInChild)
    StandInChild.script, StandInChild.made = [], []
    return StandInChild


@pytest.fixture
def state(tmp_path: Path) -> Iterator[ClusterState]:
    cluster = ClusterState(Settings(run_dir=tmp_path / "run", workers_file=tmp_path / "w.txt"))
    yield cluster
    cluster.close()


def push(state: ClusterState, n: int) -> int:
    """Apply `n` gradients; the model version after them."""
    spec = state.params.spec
    grads = wire.encode({name: torch.full(shape, 1e-3) for name, shape in spec.items()})
    for _ in range(n):
        state.apply_update(Sends.GRADIENTS, "w1", state.params.version, grads)
    return state.params.version


def test_an_evaluation_is_due_every_n_versions_and_once_for_the_final_weights(
    state: ClusterState, child: type[StandInChild]
) -> None:
    config = CONFIG.model_copy(update={"eval_every_updates": 3})
    state.start_run(config, WORKERS)
    state.report_episode("w1", 1.0, 10)
    child.script = [ok(10.0), ok(20.0)]
    push(state, 2)
    state.evaluator._step()
    assert child.made == [], "due after 3 versions, not 2"
    assert push(state, 1) == 3
    state.evaluator._step()
    assert child.made[0].played == [(state.ledger.config, state.params.weights()[0])]
    status = state.status()
    assert {k: status[k] for k in EVAL_FIELDS} == {
        "evaluations": 1,
        "eval_mean_return": 10.0,
        "eval_std_return": 1.5,
        "eval_mean_length": 10.0,
        "eval_episodes": 2,
        "eval_model_version": 3,
        "eval_elapsed_s": status["eval_elapsed_s"],
        "eval_global_steps": 10,
        "eval_error": None,
    }
    assert 0 <= status["eval_elapsed_s"] <= status["elapsed_s"]
    push(state, 2)
    state.evaluator._step()
    assert len(child.made[0].played) == 1, "due 3 versions after the last one started"
    push(state, 1)
    state.evaluator._step()
    assert len(child.made[0].played) == 2 and state.status()["eval_model_version"] == 6
    assert not child.made[0].closed
    child.script = [ok(30.0)]
    push(state, 1)
    state.finish("stopped")
    state.evaluator._step()
    assert len(child.made[0].played) == 3, "the final weights are played once the run is over"
    status = state.status()
    assert (status["evaluations"], status["eval_model_version"]) == (3, 7)
    assert status["eval_mean_return"] == 30.0
    state.evaluator._step()
    assert child.made[0].closed, "the child is ended with the run"
    assert len(child.made) == 1 and len(child.made[0].played) == 3


def test_a_failed_evaluation_is_shown_and_the_run_goes_on(
    state: ClusterState, child: type[StandInChild], captured_events: CapturedEvents
) -> None:
    child.script = [
        ("error", "RuntimeError: simulator crashed"),
        EOFError("the evaluation process ended with exit code -9"),
        ok(math.inf),
        ok(7.0),
    ]
    state.start_run(CONFIG, WORKERS)
    push(state, 1)
    state.evaluator._step()
    status = state.status()
    assert (status["state"], status["evaluations"]) == ("running", 0)
    assert status["eval_error"] == "RuntimeError: simulator crashed"
    failed = captured_events.one("evaluation_failed")
    assert failed.fields["error"] == "RuntimeError: simulator crashed"
    push(state, 1)
    state.evaluator._step()
    assert state.status()["eval_error"] == "the evaluation process ended with exit code -9"
    assert child.made[0].closed, "a child whose pipe broke is replaced"
    push(state, 1)
    state.evaluator._step()
    assert state.status()["eval_error"] == "the environment's returns are not finite: (inf, inf)"
    push(state, 1)
    state.evaluator._step()
    assert len(child.made) == 2
    status = state.status()
    assert (status["state"], status["evaluations"], status["eval_error"]) == ("running", 1, None)


def test_solved_on_eval_finishes_the_run_on_the_latest_evaluation(
    state: ClusterState, child: type[StandInChild]
) -> None:
    config = CONFIG.model_copy(update={"solved_on": "eval", "target_return": 100.0})
    run_id, _ = state.start_run(config, WORKERS)
    for _ in range(100):
        state.report_episode("w1", 500.0, 10)  # the training episodes are not what counts
    child.script = [ok(99.0), ok(150.0)]
    push(state, 1)
    state.evaluator._step()
    assert (state.status()["state"], state.status()["solved"]) == ("running", False)
    # An evaluation of an earlier run's weights is dropped.
    taken = {"model_version": 1, "elapsed_s": 0.0, "global_steps": 0}
    state.record_evaluation("an-earlier-run", taken, dataclasses.asdict(ok(150.0)[1]), None)
    assert state.status()["evaluations"] == 1
    push(state, 1)
    state.evaluator._step()
    status = state.status()
    assert (status["state"], status["solved"]) == ("finished", True)
    assert status["finish_reason"] == "solved: mean return of the latest evaluation 150.0 >= 100.0"
    saved = RunStore(state.settings.run_dir)
    assert saved.load().state["run_state"] == "finished", "saved at once"
    assert [r["mean_return"] for r in saved.read_evaluations()] == [99.0, 150.0]
    assert state.ledger.run_id == run_id


# -- through the app, with the real evaluation process ---------------------------------------------


def gauges(c: TestClient) -> dict[str, float]:
    """The master's /metrics samples without labels, by name."""
    families = text_string_to_metric_families(c.get("/metrics").text)
    return {s.name: s.value for f in families for s in f.samples if not s.labels}


@pytest.mark.integration  # the real evaluation process
def test_the_master_evaluates_while_it_trains_and_keeps_the_evaluations(
    tmp_path: Path, standin: StandInWorker
) -> None:
    settings = Settings(run_dir=tmp_path / "run", workers_file=tmp_path / "w.txt", token=TOKEN)
    train = {**STAND_IN_RUN, "workers": [standin.url], "eval_every_updates": 1, "eval_episodes": 2}
    with TestClient(create_app(settings), headers=AUTH) as c:
        assert c.post("/train", json=train).status_code == 202
        before = c.get("/status").json()
        assert {k: before[k] for k in EVAL_FIELDS} == {
            **dict.fromkeys(EVAL_FIELDS),
            "evaluations": 0,
        }
        assert "a3c_eval_mean_return" not in gauges(c)  # no made-up score before the first
        weights = st_load(c.get("/global_model_weights").content)
        grads = wire.encode({name: torch.full_like(t, 1e-3) for name, t in weights.items()})
        for version in (0, 1):
            headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": str(version)}
            assert c.post("/gradients", content=grads, headers=headers).status_code == 200

        def evaluated_the_latest() -> dict[str, Any] | None:
            status = c.get("/status").json()
            return status if status["eval_model_version"] == 2 else None

        status = wait_for(evaluated_the_latest, 120, "an evaluation of model version 2")
        assert status["state"] == "running" and status["eval_error"] is None
        assert status["eval_episodes"] == 2
        # CartPole pays 1 a step: the return is the length.
        assert status["eval_mean_return"] == status["eval_mean_length"] >= 1
        assert math.isfinite(status["eval_std_return"])
        assert gauges(c)["a3c_eval_mean_return"] == status["eval_mean_return"]  # GET /metrics
    assert not [p for p in multiprocessing.active_children() if p.name == "a3c-evaluation"]

    with TestClient(create_app(settings), headers=AUTH) as c:  # a restart shows the same
        after = c.get("/status").json()
        assert {k: after[k] for k in EVAL_FIELDS} == {k: status[k] for k in EVAL_FIELDS}
    rows = RunStore(settings.run_dir).read_evaluations()
    assert [r["evaluation"] for r in rows] == list(range(1, status["evaluations"] + 1))
    assert (rows[-1]["model_version"], rows[-1]["mean_return"]) == (2, status["eval_mean_return"])
