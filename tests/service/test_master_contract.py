"""Parts of the master's contract (docs/http-api.md) that the black-box suites checked on
real processes and the other test_master_*.py files do not: the types of /status while a run
runs, the config's README defaults, the 100-episode window of `mean_return_100` and
`target_return`, and the running statistics merged from the workers' gradient bodies.
In-process (TestClient); the run's only worker is the stand-in, so every counter is the test's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from a3c_http.config.settings import Settings
from a3c_http.models.normalize import statistics_entries
from a3c_http.testing.standin import StandInWorker
from master.app import create_app
from tests.support.common import OCTET

# README "Training config": the defaults (target_return is CartPole-v1's reward threshold).
CONFIG_DEFAULTS = {
    "env_id": "CartPole-v1", "env_kwargs": {}, "num_envs": 8, "hidden_sizes": [64, 64],
    "lr": 0.0007, "gamma": 0.99, "gae_lambda": 1.0, "t_max": 5, "entropy_coef": 0.0,
    "value_coef": 0.5, "max_grad_norm": 0.5, "algo": "a3c", "max_staleness": 128,
    "max_episodes": None, "max_steps": 2000000, "target_return": 475.0,
    "heartbeat_interval_s": 2.0, "shared_torso": False, "optimizer": "rmsprop",
    "lr_schedule": "constant", "normalize_obs": False, "normalize_reward": False,
    "max_in_flight": 16, "wire_dtype": "float32",
}
WORKER_STATES = {"starting", "running", "done", "lost", "failed"}


def is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@pytest.fixture
def master(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    for name in ("A3C_TOKEN", "A3C_MASTER_URL"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "workers.txt").write_text("")
    settings = Settings(run_dir=tmp_path / "run", workers_file=tmp_path / "workers.txt")
    with StandInWorker() as standin, TestClient(
        create_app(settings), client=("127.0.0.1", 50000)
    ) as c:
        c.standin = standin  # type: ignore[attr-defined]
        yield c


def start(c: TestClient, **config: object) -> dict:
    body = {"workers": [c.standin.url], "heartbeat_timeout_s": 3600, "seed": 1, **config}
    reply = c.post("/train", json=body)
    assert reply.status_code == 202, reply.text
    return reply.json()["data"]


def episode(c: TestClient, reward: float, length: int = 5) -> dict:
    reply = c.post("/episode", json={"worker_id": "w1", "reward": reward, "length": length})
    assert reply.status_code == 200, reply.text
    return reply.json()["data"]


def status(c: TestClient) -> dict:
    reply = c.get("/status")
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_status_of_a_running_run_has_the_documented_types_and_defaults(master: TestClient) -> None:
    run = start(master)
    s = status(master)
    assert s["state"] == "running" and s["run_id"] == run["run_id"]
    assert s["env_id"] == "CartPole-v1"
    for f in ("global_episode", "global_steps", "model_version", "updates_applied",
              "updates_rejected", "queue_length", "queue_dropped"):
        assert type(s[f]) is int and s[f] >= 0, (f, s[f])
    for f in ("best_score", "moving_average", "mean_return_100"):
        assert s[f] is None or is_number(s[f]), (f, s[f])
    assert s["solved"] is False and is_number(s["elapsed_s"]) and s["elapsed_s"] >= 0
    (w,) = s["workers"]
    assert w["state"] in WORKER_STATES and w["url"] == master.standin.url, w
    assert is_number(w["last_seen_s"]) and type(w["episodes"]) is int, w
    assert type(w["steps"]) is int, w
    # The config is resolved: what the run was given, and the README's defaults for the rest.
    config = s["config"]
    assert config["seed"] == 1 and config["heartbeat_timeout_s"] == 3600
    wrong = {k: (v, config.get(k, "<absent>")) for k, v in CONFIG_DEFAULTS.items()
             if config.get(k, "<absent>") != v}
    assert not wrong, wrong


def test_mean_return_100_is_the_mean_of_the_last_100(master: TestClient) -> None:
    start(master)
    for reward in range(1, 106):
        episode(master, reward, 1)
    s = status(master)
    assert s["global_episode"] == 105 and s["global_steps"] == 105, s
    assert s["mean_return_100"] == pytest.approx(sum(range(6, 106)) / 100), s


def test_target_return_is_judged_over_a_full_window_of_100_episodes(master: TestClient) -> None:
    # README: like gymnasium's "solved", over 100 consecutive episodes; until there are 100,
    # mean_return_100 shows the mean of the episodes so far.
    start(master, target_return=50)
    replies = [episode(master, 60) for _ in range(99)]
    s = status(master)
    assert s["mean_return_100"] == pytest.approx(60), s
    assert s["state"] == "running" and s["solved"] is False, s
    assert not any(r["stop"] for r in replies)
    assert episode(master, 60)["stop"] is True
    s = status(master)
    assert s["state"] == "finished" and s["solved"] is True, s
    assert s["finish_reason"].startswith("solved"), s
    assert s["mean_return_100"] == pytest.approx(60), s
    # An episode that ended just after the finish still counts, and cannot unsolve the run.
    episode(master, -5000)
    s = status(master)
    assert s["mean_return_100"] < 50 and s["solved"] is True, s


def test_workers_statistics_are_merged_by_the_master_and_shipped_with_the_weights(
    master: TestClient,
) -> None:
    start(master, normalize_obs=True, normalize_reward=True)
    weights = master.get("/global_model_weights")
    spec = {k: tuple(v.shape) for k, v in st_load(weights.content).items()}
    version = int(weights.headers["X-Model-Version"])
    # Two workers each saw a batch of observations: their moments travel with zero gradients.
    for value, n in ((2.0, 30), (4.0, 10)):
        body = {k: torch.zeros(s) for k, s in spec.items()}
        body |= statistics_entries("obs_rms", torch.full((n, 4), value))
        body |= statistics_entries("ret_rms", torch.full((n,), value))
        reply = master.post("/gradients", content=st_save(body), headers={
            **OCTET, "X-Worker-Id": "w1", "X-Model-Version": str(version)})
        assert reply.status_code == 200, reply.text
        version = int(reply.headers["X-Model-Version"])
    shipped = st_load(master.get("/global_model_weights").content)
    # 30 samples of 2 and 10 of 4: mean 2.5, variance 0.75 (the prior count of 1e-4 aside).
    assert torch.allclose(shipped["obs_rms.mean"], torch.full((4,), 2.5), atol=1e-3)
    assert torch.allclose(shipped["obs_rms.var"], torch.full((4,), 0.75), atol=1e-3)
    assert float(shipped["ret_rms.count"]) == pytest.approx(40, abs=1e-3)


def test_train_with_an_env_id_runs_its_preset_and_names_it(master: TestClient) -> None:
    start(master, env_id="Acrobot-v1", t_max=7)
    config = status(master)["config"]
    assert config["preset"] == "Acrobot-v1" and config["normalize_obs"] is True
    assert config["t_max"] == 7  # the body's value, not the preset's
    saved = json.loads((master.app.state.cluster.settings.run_dir / "config.json").read_text())
    assert saved["preset"] == "Acrobot-v1" and saved["normalize_reward"] is True
