"""Runs on real processes: the session cluster (a master and workers, each a uvicorn process on a
free loopback port, with a token that every run carries both ways), run after run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from a3c_http import wire
from a3c_http.config import TrainConfig
from a3c_http.localcluster import LocalCluster, ServiceProcess, free_port, wait_for
from a3c_http.model import build_model
from tests.conftest import PATIENT
from tests.support import ENDLESS_RUN, SHORT_RUN

pytestmark = pytest.mark.integration


def patient(cluster: LocalCluster) -> list[ServiceProcess]:
    return [cluster.workers[i] for i in PATIENT]


@pytest.mark.parametrize("sync_mode", ["gradients", "best_weights"])
def test_a_short_run_adds_up(cluster: LocalCluster, sync_mode: str) -> None:
    workers = patient(cluster)
    before = cluster.status()
    # The run's fresh weights are a change of the global weights, unless they are the folder's
    # first: versions keep rising across the runs of a run folder.
    fresh_version = before["model_version"] + (1 if before["run_id"] else 0)
    reply = cluster.train(**SHORT_RUN, sync_mode=sync_mode, workers=[w.url for w in workers])
    assert reply.status_code == 202, reply.text
    assert all(w["started"] for w in reply.json()["data"]["workers"])

    assert cluster.wait_finished()["finish_reason"].startswith("max_episodes")
    # Every worker learns of the end at its next exchange, reports done, and tells the master.
    # An episode that ended just after the finish still counts, so the totals are read now.
    status, statuses = cluster.wait_workers_settled(workers)
    assert [s["state"] for s in statuses] == ["done", "done"], statuses

    # The episodes the workers had accepted add up to the global count, and so do their steps;
    # env_steps adds the steps of the episodes still going on when the run ended.
    assert sum(w["episodes"] for w in statuses) == status["global_episode"] >= 40
    assert sum(w["steps"] for w in statuses) == status["global_steps"] <= status["env_steps"]
    assert status["env_steps"] <= sum(w["env_steps"] for w in statuses)
    assert all(w["episodes"] > 0 for w in statuses), "both workers took part"
    for w in statuses:
        metrics = w["metrics"]
        names = {"train/policy_loss", "train/value_loss", "train/entropy", "time/fps",
                 "rollout/ep_rew_mean"}
        assert names <= set(metrics), metrics
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert 0 < metrics["train/entropy"] <= math.log(2) + 1e-6  # two actions
    # Each update took the version one up.
    assert status["updates_applied"] > 0
    assert status["model_version"] == fresh_version + status["updates_applied"]

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


def test_a_stopped_run_is_archived_and_the_workers_serve_the_next(cluster: LocalCluster) -> None:
    urls = [w.url for w in patient(cluster)]
    assert cluster.train(**ENDLESS_RUN, workers=urls).status_code == 202
    wait_for(lambda: cluster.status()["global_episode"] >= 5, 60, "some episodes")
    assert cluster.train(**ENDLESS_RUN, workers=urls).status_code == 409

    first, statuses = cluster.stop_run()
    assert first["state"] == "finished" and first["finish_reason"] == "stopped by POST /stop"
    assert [s["state"] for s in statuses[:2]] == ["done", "done"], statuses

    # The same worker processes take part in the next run, which starts from zero.
    reply = cluster.train(**{**SHORT_RUN, "max_episodes": 10}, workers=urls)
    assert reply.status_code == 202, reply.text
    assert reply.json()["data"]["run_id"] != first["run_id"]
    assert all(w["started"] for w in reply.json()["data"]["workers"])
    second = cluster.wait_finished()
    assert second["finish_reason"].startswith("max_episodes"), second
    assert (cluster.run_dir / "archive" / first["run_id"]).is_dir()


def test_a_worker_whose_environment_fails_is_failed_on_both_sides(cluster: LocalCluster) -> None:
    workers = patient(cluster)
    body = {
        **SHORT_RUN,
        "env_id": "tests.envs:FailingCartPole-v0",
        "env_kwargs": {"fail_after": 30},
        "workers": [w.url for w in workers],
    }
    reply = cluster.train(**body)
    assert reply.status_code == 202, reply.text
    status = cluster.wait_finished(60)
    assert status["finish_reason"] == "no worker is running any more"
    assert {w["state"] for w in status["workers"]} == {"failed"}
    for record in status["workers"]:
        assert "simulator crashed after 30 steps" in record["error"]
    for p in workers:
        ws = cluster.worker_status(p)
        assert ws["state"] == "failed" and "simulator crashed" in ws["error"], ws


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
    # Its own process: the property is what a process does at start-up.
    proc = ServiceProcess(app, free_port(), tmp_path / "out.log", env=env).start()
    try:
        wait_for(lambda: not proc.running(), 30, "the service to refuse to start")
    finally:
        proc.stop()
    log = (tmp_path / "out.log").read_text()
    assert proc.proc.returncode == 1
    assert message in log
    assert "Traceback" not in log
