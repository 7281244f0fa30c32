"""Runs on real processes: the session cluster (a master and workers, each a uvicorn process on a
free loopback port, with a token that every run carries both ways), run after run."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from a3c_http.algos.registry import train_config
from a3c_http.local.cluster import LocalCluster, ServiceProcess, free_port, wait_for
from a3c_http.models.actor_critic import build_model
from a3c_http.store.runstore import RunStore
from a3c_http.testing.standin import StandInWorker
from a3c_http.wire import tensors as wire
from tests.support.common import (
    ENDLESS_RUN,
    MAX_BODY,
    OCTET,
    PATIENT,
    SHORT_RUN,
    STAND_IN_RUN,
    snapshot,
)

pytestmark = pytest.mark.integration


def patient(cluster: LocalCluster) -> list[ServiceProcess]:
    return [cluster.workers[i] for i in PATIENT]


@pytest.mark.parametrize("algo", ["a3c", "best_weights"])
def test_a_short_run_adds_up(cluster: LocalCluster, algo: str) -> None:
    workers = patient(cluster)
    before = cluster.status()
    # The run's fresh weights are a change of the global weights, unless they are the folder's
    # first: versions keep rising across the runs of a run folder.
    fresh_version = before["model_version"] + (1 if before["run_id"] else 0)
    reply = cluster.train(**SHORT_RUN, algo=algo, workers=[w.url for w in workers])
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
    config = train_config(**SHORT_RUN, algo=algo)
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        initial = build_model(config.env_id, config.env_kwargs, config.hidden_sizes)
    final = wire.decode(response.content, wire.spec_of(initial))
    assert int(response.headers["X-Model-Version"]) == status["model_version"]
    assert all(torch.isfinite(t).all() for t in final.values())
    moved = sum(float((final[k] - v).abs().sum()) for k, v in initial.state_dict().items())
    assert moved > 1e-3


def test_a_stopped_run_is_archived_and_the_workers_serve_the_next(cluster: LocalCluster) -> None:
    # Without "workers", a run goes to every worker of the workers file (A3C_WORKERS_FILE).
    reply = cluster.train(**ENDLESS_RUN)
    assert reply.status_code == 202, reply.text
    assert [w["url"] for w in reply.json()["data"]["workers"]] == [
        w.url for w in cluster.workers
    ]
    wait_for(lambda: cluster.status()["global_episode"] >= 5, 60, "some episodes")
    assert cluster.train(**ENDLESS_RUN).status_code == 409

    first, statuses = cluster.stop_run()
    assert first["state"] == "finished" and first["finish_reason"] == "stopped by POST /stop"
    assert {s["state"] for s in statuses} == {"done"}, statuses
    urls = [w.url for w in patient(cluster)]

    # The same worker processes take part in the next run, which starts from zero.
    reply = cluster.train(**{**SHORT_RUN, "max_episodes": 10}, workers=urls)
    assert reply.status_code == 202, reply.text
    assert reply.json()["data"]["run_id"] != first["run_id"]
    assert all(w["started"] for w in reply.json()["data"]["workers"])
    second = cluster.wait_finished()
    assert second["finish_reason"].startswith("max_episodes"), second
    # The first run's folder is archived whole: one history row per episode it counted.
    archived = RunStore(cluster.run_dir / "archive" / first["run_id"]).read_episodes()
    assert [r["global_episode"] for r in archived] == list(range(1, first["global_episode"] + 1))


def test_a_worker_whose_environment_fails_is_failed_on_both_sides(cluster: LocalCluster) -> None:
    workers = patient(cluster)
    body = {
        **SHORT_RUN,
        "env_id": "tests.support.envs:FailingCartPole-v0",
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


# One per service: which values are refused, and how they are named, is test_settings.py's.
BAD_SETTINGS = [
    ("master.app:app", {"A3C_PERSIST_INTERVAL_S": "abc"}, "A3C_PERSIST_INTERVAL_S='abc'"),
    ("worker.app:app", {"A3C_MAX_BODY_BYTES": "12"}, "A3C_MAX_BODY_BYTES='12'"),
]


def test_a_bad_setting_stops_the_service_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    # Processes of their own (started together): the property is what a process does at
    # start-up.
    procs = [
        ServiceProcess(app, free_port(), tmp_path / f"{i}.log", env=env)
        for i, (app, env, _) in enumerate(BAD_SETTINGS)
    ]
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            wait_for(lambda p=proc: not p.running(), 60, f"{proc.app} to refuse to start")
    finally:
        for proc in procs:
            proc.stop()
    for proc, (app, _, message) in zip(procs, BAD_SETTINGS, strict=True):
        log = proc.log_path.read_text()
        assert proc.proc.returncode == 1, (app, log)
        assert message in log, (app, log)
        assert "Traceback" not in log, (app, log)


# -- one real-server check of what test_http_auth.py and test_http_bad_input.py check in-process


@pytest.fixture
def stand_in_run(cluster: LocalCluster, standin: StandInWorker) -> Iterator[LocalCluster]:
    """The session master running a run whose only worker is the stand-in."""
    reply = cluster.train(**STAND_IN_RUN, workers=[standin.url])
    assert reply.status_code == 202, reply.text
    yield cluster
    cluster.http.post(f"{cluster.master.url}/stop", json={})


def test_the_real_servers_refuse_a_wrong_token_and_a_body_over_the_limit(
    stand_in_run: LocalCluster,
) -> None:
    cluster = stand_in_run
    master, worker = cluster.master, cluster.workers[0]
    before = snapshot(cluster.http, master.url)
    worker_before = cluster.worker_status(worker)
    with httpx.Client(timeout=30, trust_env=False) as anonymous:
        for p in (master, worker):
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                for method, path in (("GET", "/status"), ("POST", "/stop")):
                    reply = anonymous.request(method, f"{p.url}{path}", headers=headers)
                    assert reply.status_code == 401, (p.app, method, path, reply.text)
                    assert reply.headers["WWW-Authenticate"] == "Bearer"
            assert anonymous.get(f"{p.url}/healthz").json() == {"status": "ok"}

    def chunks() -> Iterator[bytes]:  # no Content-Length
        for _ in range(8):
            yield b"\0" * (MAX_BODY // 4)

    version = before["weights"][0]
    headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": version}
    for content in (b"\0" * (MAX_BODY + 1), chunks()):
        reply = cluster.http.post(f"{master.url}/gradients", content=content, headers=headers)
        assert reply.status_code == 413, reply.text
        assert "A3C_MAX_BODY_BYTES" in reply.json()["detail"]
    big = {"master_url": master.url, "worker_id": "big", "pad": "x" * MAX_BODY}
    reply = cluster.http.post(f"{worker.url}/start_worker", json=big)
    assert reply.status_code == 413, reply.text
    assert snapshot(cluster.http, master.url) == before
    after = cluster.worker_status(worker)
    assert (after["state"], after["run_id"]) == (worker_before["state"], worker_before["run_id"])
