"""GET /metrics on the master and the workers: Prometheus's text format, made with
prometheus-client, whose figures equal /status. Through TestClient."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.support import master_running, push_rollout
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
