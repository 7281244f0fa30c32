"""A real master and two real workers, each a uvicorn process on a free loopback port."""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from a3c_http import wire
from a3c_http.config import TrainConfig
from a3c_http.localcluster import LocalCluster, ServiceProcess, free_port
from a3c_http.model import build_model
from a3c_http.store import RunStore
from tests.support import SHORT_RUN, master_sees_every_worker_done, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path / "run",
        tmp_path / "logs",
        workers=[("127.0.0.1", free_port()), ("127.0.0.1", free_port())],
        env={"A3C_PERSIST_INTERVAL_S": "1", "A3C_ENV_MODULES": "tests.envs"},
    ).start()
    try:
        yield c
    finally:
        c.close()
        for p in c.processes:
            assert not p.running(), f"{p.app} on port {p.port} is still running"


@pytest.mark.parametrize("sync_mode", ["gradients", "best_weights"])
def test_short_run_adds_up_and_every_process_ends(cluster: LocalCluster, sync_mode: str) -> None:
    reply = cluster.http.post(
        f"{cluster.master.url}/train", json={**SHORT_RUN, "sync_mode": sync_mode}
    )
    assert reply.status_code == 202, reply.text
    assert all(w["started"] for w in reply.json()["data"]["workers"])

    status = wait_for(
        lambda: (s := cluster.status())["state"] == "finished" and s, 120, "the run to finish"
    )
    assert status["finish_reason"].startswith("max_episodes")
    # Every worker learns of the end at its next exchange and reports done.
    def workers_done() -> list[dict] | None:
        statuses = [cluster.worker_status(p) for p in cluster.workers]
        return statuses if all(s["state"] == "done" for s in statuses) else None

    workers = wait_for(workers_done, 60, "both workers to be done")
    # ...and each then tells the master, whose registry shows them done.
    # An episode that ended just after the finish still counts, so the totals are read now.
    status = wait_for(
        lambda: master_sees_every_worker_done(cluster.status),
        30,
        "the master to see both workers done",
    )

    # The episodes the workers had accepted add up to the global count, and so do their steps;
    # env_steps adds the steps of the episodes still going on when the run ended.
    assert sum(w["episodes"] for w in workers) == status["global_episode"] >= 40
    assert sum(w["steps"] for w in workers) == status["global_steps"] <= status["env_steps"]
    assert status["env_steps"] <= sum(w["env_steps"] for w in workers)
    assert all(w["episodes"] > 0 for w in workers), "both workers took part"
    for w in workers:
        metrics = w["metrics"]
        names = {"train/policy_loss", "train/value_loss", "train/entropy", "time/fps",
                 "rollout/ep_rew_mean"}
        assert names <= set(metrics), metrics
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert 0 < metrics["train/entropy"] <= math.log(2) + 1e-6  # two actions
    assert status["updates_applied"] > 0 and status["model_version"] == status["updates_applied"]

    # The global weights moved away from the seeded initial weights and are finite.
    response = cluster.http.get(f"{cluster.master.url}/global_model_weights")
    config = TrainConfig(**SHORT_RUN, sync_mode=sync_mode)
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        initial = build_model(config.env_id, config.env_kwargs, config.hidden_sizes)
    final = wire.decode(response.content, wire.spec_of(initial))
    assert int(response.headers["X-Model-Version"]) == status["model_version"]
    assert all(torch.isfinite(t).all() for t in final.values())
    moved = sum(float((final[k] - v).abs().sum()) for k, v in initial.state_dict().items())
    assert moved > 1e-3

    # The run folder holds one history row per episode once the master has ended.
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it: -SIGTERM is its clean exit.
    assert cluster.master.stop() in (0, -signal.SIGTERM)
    rows = RunStore(cluster.run_dir).read_episodes()
    assert [r["global_episode"] for r in rows] == list(range(1, status["global_episode"] + 1))


def test_stop_ends_the_run_and_a_worker_serves_the_next_one(cluster: LocalCluster) -> None:
    endless = {**SHORT_RUN, "max_episodes": None, "max_steps": None, "target_return": 1e9}
    assert cluster.http.post(f"{cluster.master.url}/train", json=endless).status_code == 202
    wait_for(lambda: cluster.status()["global_episode"] >= 10, 60, "some episodes")
    assert cluster.http.post(f"{cluster.master.url}/train", json=endless).status_code == 409

    assert cluster.http.post(f"{cluster.master.url}/stop").status_code == 200
    wait_for(
        lambda: all(cluster.worker_status(p)["state"] == "done" for p in cluster.workers),
        60,
        "the workers to stop",
    )
    first = cluster.status()
    assert first["state"] == "finished"

    # The same worker processes take part in a second run, which starts from zero.
    reply = cluster.http.post(f"{cluster.master.url}/train", json=SHORT_RUN)
    assert reply.status_code == 202, reply.text
    assert reply.json()["data"]["run_id"] != first["run_id"]
    second = wait_for(
        lambda: (s := cluster.status())["state"] == "finished" and s, 120, "the second run"
    )
    assert second["finish_reason"].startswith("max_episodes")
    archived = RunStore(cluster.run_dir / "archive" / first["run_id"])
    assert len(archived.read_episodes()) == first["global_episode"]


def test_a_worker_whose_environment_fails_is_failed_on_both_sides(cluster: LocalCluster) -> None:
    body = {
        **SHORT_RUN,
        "env_id": "tests.envs:FailingCartPole-v0",
        "env_kwargs": {"fail_after": 30},
    }
    reply = cluster.http.post(f"{cluster.master.url}/train", json=body)
    assert reply.status_code == 202, reply.text
    status = wait_for(
        lambda: (s := cluster.status())["state"] == "finished" and s, 60, "the run to end"
    )
    assert status["finish_reason"] == "no worker is running any more"
    assert {w["state"] for w in status["workers"]} == {"failed"}
    for record in status["workers"]:
        assert "simulator crashed after 30 steps" in record["error"]
    for p in cluster.workers:
        ws = cluster.worker_status(p)
        assert ws["state"] == "failed" and "simulator crashed" in ws["error"], ws


def test_a_module_outside_the_allowlist_is_refused(cluster: LocalCluster) -> None:
    reply = cluster.http.post(f"{cluster.master.url}/train", json={"env_id": "os:Anything-v0"})
    assert reply.status_code == 422
    assert "A3C_ENV_MODULES" in reply.json()["detail"]
    assert cluster.status()["state"] == "idle"


@pytest.mark.parametrize(
    ("app", "env", "message"),
    [
        ("master.app:app", {"A3C_PERSIST_INTERVAL_S": "abc"}, "A3C_PERSIST_INTERVAL_S='abc'"),
        ("worker.app:app", {"A3C_MAX_BODY_BYTES": "12"}, "A3C_MAX_BODY_BYTES='12'"),
        ("worker.app:app", {"A3C_MASTER_RETRY_S": "soon"}, "A3C_MASTER_RETRY_S='soon'"),
    ],
)
def test_a_bad_setting_stops_the_service_with_a_message_not_a_traceback(
    tmp_path: Path, app: str, env: dict, message: str
) -> None:
    proc = ServiceProcess(app, free_port(), tmp_path / "out.log", env=env).start()
    try:
        wait_for(lambda: not proc.running(), 30, "the service to refuse to start")
    finally:
        proc.stop()
    log = (tmp_path / "out.log").read_text()
    assert proc.proc.returncode == 1
    assert message in log
    assert "Traceback" not in log
