"""Per-worker exploration (a3c_http/algos/exploration.py): the master's derivation from a worker's
place, the widened Gaussian a worker acts and learns with, and the master's side through TestClient
with stand-in workers (the worker's side is in test_worker_api.py)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from torch.distributions import Normal

import a3c_http.algos.a3c.algorithm as a3c_module
from a3c_http.algos.a3c.algorithm import A3C
from a3c_http.algos.exploration import Exploration, ExplorationError, derive, widened
from a3c_http.algos.registry import model_for, train_config
from a3c_http.config.settings import Settings
from a3c_http.envs.rollout import RolloutCollector
from a3c_http.models.actor_critic import build_model
from a3c_http.net.client import MasterClient
from a3c_http.testing.standin import StandInWorker
from a3c_http.wire import tensors as wire
from master.app import create_app
from worker.trainer import Progress, Trainer

# -- the derivation -------------------------------------------------------------------------------


def test_derive_spreads_each_worker_by_its_index_alone_ends_first() -> None:
    cfg = train_config(entropy_coef=0.01, entropy_coef_max=0.05, log_std_spread=1.0)
    first, second, third = (derive(cfg, k, A3C) for k in range(3))
    # The ends exactly, not up to rounding: the first two workers, however many join later.
    assert first == Exploration(entropy_coef=0.01, log_std_offset=0.0)
    assert second == Exploration(entropy_coef=0.05, log_std_offset=1.0)
    assert third.entropy_coef == pytest.approx(0.03) and third.log_std_offset == 0.5
    # The next ones halve the gaps: 9 workers sit on the eighths, each once.
    assert sorted(derive(cfg, k, A3C).log_std_offset for k in range(9)) == [k / 8 for k in range(9)]
    with pytest.raises(ValueError, match="index -1"):
        derive(cfg, -1, A3C)


def test_without_a_spread_every_worker_gets_the_configs_entropy_coef() -> None:
    cfg = train_config(entropy_coef=0.02)
    same = Exploration(entropy_coef=0.02, log_std_offset=0.0)
    assert [derive(cfg, k, A3C) for k in range(4)] == [same] * 4


# -- the widened policy ---------------------------------------------------------------------------


def test_the_widened_policy_is_the_models_gaussian_made_wider() -> None:
    torch.manual_seed(0)
    model = build_model("Pendulum-v1", {}, [8])
    policy = widened(model, 0.5)
    obs = torch.randn(5, 3)
    base, value = model(obs)
    wide, wide_value = policy(obs)
    assert torch.equal(wide.mean, base.mean) and torch.equal(wide_value, value)
    assert torch.equal(policy.value(obs), model.value(obs))
    assert torch.allclose(wide.stddev, base.stddev * math.exp(0.5))
    # What the loss takes of it: the log-probabilities and the entropy of the wider Gaussian.
    actions = wide.sample()
    expected = Normal(base.mean, base.stddev * math.exp(0.5)).log_prob(actions).sum(-1)
    assert torch.allclose(wide.log_prob(actions), expected)
    assert torch.allclose(wide.entropy(), base.entropy() + 0.5 * model.action_dim)
    # Its gradients reach the model's own mean and log_std.
    wide.log_prob(actions).sum().backward()
    assert model.log_std.grad is not None and model.log_std.grad.abs().sum() > 0
    assert model.policy_head.weight.grad is not None


def test_no_offset_is_the_model_and_discrete_actions_take_none() -> None:
    gaussian = build_model("Pendulum-v1", {}, [8])
    categorical = build_model("CartPole-v1", {}, [8])
    assert widened(gaussian, 0.0) is gaussian and widened(categorical, 0.0) is categorical
    with pytest.raises(ExplorationError, match="discrete"):
        widened(categorical, 0.5)


def test_a_worker_acts_and_learns_with_the_same_widened_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rollout is sampled from the widened Gaussian and the loss scores it under that same
    Gaussian: on-policy for this worker."""
    config = train_config(
        env_id="Pendulum-v1", seed=3, num_envs=2, t_max=4
    )
    weights = wire.encode(model_for(config).state_dict())
    widths: dict[str, float] = {}

    def width(policy) -> float:  # the policy's std over the model's own
        with torch.no_grad():
            dist, _ = policy(torch.zeros(1, 3))
            return float((dist.stddev / policy.log_std.exp()).mean())

    collect, loss = RolloutCollector.collect, a3c_module.rollout_loss

    def acting(self, policy, t_max, *args):
        widths.setdefault("act", width(policy))
        return collect(self, policy, t_max, *args)

    def learning(policy, rollout, cfg):
        widths.setdefault("learn", width(policy))
        return loss(policy, rollout, cfg)

    monkeypatch.setattr(RolloutCollector, "collect", acting)
    monkeypatch.setattr(a3c_module, "rollout_loss", learning)

    def master(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/global_model_weights":
            return httpx.Response(200, content=weights, headers={"X-Model-Version": "0"})
        if request.url.path == "/gradients":  # one update, and the run is over
            headers = {"X-Model-Version": "1", "X-A3C-Stop": "1"}
            return httpx.Response(200, content=weights, headers=headers)
        return httpx.Response(200, json={"data": {}})

    client = MasterClient("http://master", transport=httpx.MockTransport(master), run_id="r1")
    progress = Progress()
    Trainer(config, client, "w2", None, threading.Event(), progress, log_std_offset=0.5).run()
    assert widths == {"act": pytest.approx(math.exp(0.5)), "learn": pytest.approx(math.exp(0.5))}
    assert progress.updates >= 1


# -- the master -----------------------------------------------------------------------------------


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ("A3C_TOKEN", "A3C_MASTER_URL", "A3C_MAX_BODY_BYTES"):
        monkeypatch.delenv(name, raising=False)
    return Settings(run_dir=tmp_path / "run", workers_file=tmp_path / "workers.txt")


@pytest.fixture
def standins() -> Iterator[list[StandInWorker]]:
    with StandInWorker() as a, StandInWorker() as b, StandInWorker() as c:
        yield [a, b, c]


def master(settings: Settings) -> TestClient:
    return TestClient(create_app(settings), client=("127.0.0.1", 50000))


def test_train_gives_each_worker_its_exploration_in_status_and_start_request(
    settings: Settings, standins: list[StandInWorker]
) -> None:
    body = {
        "workers": [s.url for s in standins],
        "env_id": "Pendulum-v1",
        "entropy_coef": 0.01,
        "entropy_coef_max": 0.05,
        "log_std_spread": 0.5,
        "heartbeat_timeout_s": 3600,
        "seed": 1,
    }
    with master(settings) as c:
        reply = c.post("/train", json=body)
        assert reply.status_code == 202, reply.text
        workers = c.get("/status").json()["workers"]
    assert [w["worker_id"] for w in workers] == ["w1", "w2", "w3"]
    shown = [w["exploration"] for w in workers]
    assert [e["entropy_coef"] for e in shown] == pytest.approx([0.01, 0.05, 0.03])
    assert [e["log_std_offset"] for e in shown] == [0.0, 0.5, 0.25]
    # Each worker was sent what /status shows of it.
    assert [s.starts()[0]["body"]["exploration"] for s in standins] == shown
    # Saved with the registry: a master resumed on the run folder shows the same.
    with master(settings) as c:
        assert [w["exploration"] for w in c.get("/status").json()["workers"]] == shown


def test_log_std_spread_on_discrete_actions_is_refused(
    settings: Settings, standins: list[StandInWorker]
) -> None:
    body = {"workers": [standins[0].url], "env_id": "CartPole-v1", "log_std_spread": 0.5}
    with master(settings) as c:
        reply = c.post("/train", json=body)
        assert reply.status_code == 422, reply.text
        assert "log_std_spread" in reply.json()["detail"]
        assert "discrete" in reply.json()["detail"]
        assert c.get("/status").json()["state"] == "idle"
    assert standins[0].starts() == []
