"""GET /metrics on the master and the workers: Prometheus's text format, made with
prometheus-client, whose figures equal /status. Through TestClient."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.common import master_running, push_rollout
from worker.app import create_app as create_worker


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def push(c: TestClient, seq: int, behind: int = 0) -> int:
    version = c.app.state.cluster.params.version - behind
    return push_rollout(c, seq, [[9.0, 9]], version=version).status_code


def test_the_masters_metrics_equal_its_status(tmp_path: Path) -> None:
    with master_running(tmp_path, max_staleness=0) as c:
        assert [push(c, 1), push(c, 2), push(c, 3, behind=1)] == [200, 200, 409]
        r = c.get("/metrics")
        status = c.get("/status").json()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    got = samples(r.text)
    assert got[("a3c_episodes_total", ())] == status["global_episode"] == 3
    assert got[("a3c_env_steps_total", ())] == status["env_steps"]
    assert got[("a3c_best_score", ())] == status["best_score"] == 9.0
    assert got[("a3c_moving_average_return", ())] == status["moving_average"]
    assert got[("a3c_mean_return_100", ())] == status["mean_return_100"]
    assert got[("a3c_model_version", ())] == status["model_version"]
    assert got[("a3c_updates_applied_total", ())] == status["updates_applied"] == 2
    assert got[("a3c_updates_rejected_total", (("reason", "stale"),))] == 1
    assert got[("a3c_updates_rejected_total", (("reason", "outlier"),))] == 0
    for state in ("starting", "running", "done", "lost", "failed"):
        expected = sum(w["state"] == state for w in status["workers"])
        assert got[("a3c_workers", (("state", state),))] == expected
    seen = {w["worker_id"]: w["last_seen_s"] for w in status["workers"]}
    for worker_id, age in seen.items():
        # Read a moment apart: the age only grows.
        assert got[("a3c_worker_last_seen_seconds", (("worker_id", worker_id),))] <= age
    assert got[("a3c_gradient_push_seconds_count", ())] == 2  # the two answered with weights


def test_a_workers_metrics_equal_its_status() -> None:
    with TestClient(create_worker(token=""), client=("127.0.0.1", 5)) as c:
        r = c.get("/metrics")
        status = c.get("/status").json()
    got = samples(r.text)
    assert got[("a3c_worker_env_steps_total", ())] == status["env_steps"]
    assert got[("a3c_worker_updates_total", ())] == status["updates"]
    for phase in ("rollout", "learn", "http"):
        value = got[("a3c_worker_seconds_total", (("phase", phase),))]
        assert value == status["time"][f"{phase}_s"]


def names(text: str) -> set[str]:
    """Every metric family's name and every sample's (counters add `_total`, histograms more)."""
    families = list(text_string_to_metric_families(text))
    return {f.name for f in families} | {s.name for f in families for s in f.samples}


def test_no_metric_name_is_exported_by_both_services(tmp_path: Path) -> None:
    """A PromQL sum() over the master's and the workers' targets counts each figure once."""
    with master_running(tmp_path) as c:
        assert push(c, 1) == 200  # every family the master has: an episode, an update
        beat = {"worker_id": "w1", "steps_per_s": 1234.5}
        assert c.post("/heartbeat", json=beat).status_code == 200
        master = c.get("/metrics").text
    with TestClient(create_worker(token=""), client=("127.0.0.1", 5)) as c:
        progress = c.app.state.worker.progress  # every family a worker has, the optional too
        progress.steps_per_s, progress.round_trip_s = 987.0, 0.002
        worker = c.get("/metrics").text
    got = samples(master)
    assert got[("a3c_worker_reported_env_steps_per_second", (("worker_id", "w1"),))] == 1234.5
    assert samples(worker)[("a3c_worker_env_steps_per_second", ())] == 987.0
    assert len(names(master)) > 10 and len(names(worker)) > 10
    assert names(master).isdisjoint(names(worker)), names(master) & names(worker)


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (Debian's `prometheus` package; .ci/run installs it)",
)
def test_promtool_accepts_the_exposition(tmp_path: Path) -> None:
    with master_running(tmp_path) as c:
        assert push(c, 1) == 200
        text = c.get("/metrics").text
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
