"""One round trip per update: a gradient push carries the rollout's finished episodes and the
worker's statistics in its body's metadata, and its reply carries the run's summary. Through
TestClient, the test playing the workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from a3c_http.wire import tensors as wire
from tests.support.common import COUNTERS, OCTET, master_running
from tests.support.common import push_rollout as push


def counters(c: TestClient) -> dict:
    status = c.get("/status").json()
    return {key: status[key] for key in COUNTERS if key in status}


def worker(c: TestClient, worker_id: str = "w1") -> dict:
    return next(w for w in c.get("/status").json()["workers"] if w["worker_id"] == worker_id)


def test_the_episodes_and_statistics_travel_with_the_gradients(tmp_path: Path) -> None:
    with master_running(tmp_path) as c:
        r = push(c, 1, [[12.0, 12], [30.5, 31]], {"env_steps": 80, "steps_per_s": 900.0})
        assert r.status_code == 200, r.text
        status = c.get("/status").json()
        assert (status["global_episode"], status["global_steps"]) == (2, 43)
        assert status["best_score"] == 30.5 and status["updates_applied"] == 1
        assert (worker(c)["episodes"], worker(c)["env_steps"], worker(c)["steps_per_s"]) == (
            2,
            80,
            900.0,
        )
        # The reply: the new weights, and the figures POST /episode answers with.
        assert int(r.headers["X-Model-Version"]) == status["model_version"]
        assert r.headers["X-A3C-Global-Episode"] == "2"
        assert float(r.headers["X-A3C-Best-Score"]) == 30.5
        assert float(r.headers["X-A3C-Moving-Average"]) == pytest.approx(status["moving_average"])
        assert (r.headers["X-A3C-Improved"], r.headers["X-A3C-Stop"]) == ("1", "0")
        layout = c.app.state.cluster.params.net.layout
        vector, _ = layout.decode(r.content)
        assert torch.equal(vector, c.app.state.cluster.params.net.flat)


def test_a_retry_of_the_combined_request_is_counted_once(tmp_path: Path) -> None:
    with master_running(tmp_path) as c:
        assert push(c, 1, [[9.0, 9]]).status_code == 200
        before = counters(c)
        again = push(c, 1, [[9.0, 9]], version=before["model_version"] - 1)
        assert again.status_code == 200 and again.headers["X-A3C-Duplicate"] == "1"
        assert counters(c) == before
        assert worker(c)["duplicates"] == 1  # one retry, counted as one


def test_pushes_in_flight_may_arrive_out_of_order(tmp_path: Path) -> None:
    """Numbers 3, 1, 2 all count; each number once."""
    with master_running(tmp_path) as c:
        for seq in (3, 1, 2):
            assert push(c, seq, [[5.0, 5]]).status_code == 200
        status = c.get("/status").json()
        assert (status["global_episode"], status["updates_applied"]) == (3, 3)
        assert push(c, 2, [[5.0, 5]]).headers["X-A3C-Duplicate"] == "1"
        assert c.get("/status").json()["global_episode"] == 3
        # Computed two versions ago, as a push in flight behind two others is.
        assert push(c, 4, version=c.app.state.cluster.params.version - 2).status_code == 200
        status = c.get("/status").json()
        assert (status["staleness_mean"], status["staleness_total"]) == (2 / 4, 2)


def test_a_refused_push_still_counts_its_episodes_once(tmp_path: Path) -> None:
    """The episodes happened whatever becomes of the gradients; a retry of the refused push is
    judged again and refused again, its episodes not counted again."""
    with master_running(tmp_path, max_staleness=0) as c:
        assert push(c, 1).status_code == 200
        for _ in range(2):
            stale = push(c, 2, [[7.0, 7]], version=c.app.state.cluster.params.version - 1)
            assert stale.status_code == 409 and "versions old" in stale.json()["detail"]
        status = c.get("/status").json()
        assert (status["global_episode"], status["updates_applied"]) == (1, 1)


def test_the_reply_says_stop_when_the_episodes_solve_the_run(tmp_path: Path) -> None:
    with master_running(tmp_path, target_return=10.0) as c:
        for seq in range(1, 5):  # a rollout (t_max 5 x num_envs 8) finishes at most 40 episodes
            r = push(c, seq, [[50.0, 50]] * 25)
        assert r.status_code == 200 and r.headers["X-A3C-Stop"] == "1"
        assert c.get("/status").json()["solved"] is True


@pytest.mark.parametrize(
    ("metadata", "named"),
    [
        ({"a3c": "not json"}, "rollout report"),
        ({"a3c": json.dumps({"episodes": [[1.0, 0]]})}, "episodes.0.1"),
        ({"a3c": json.dumps({"episodes": [["x", 3]]})}, "episodes.0.0"),
        ({"a3c": json.dumps({"episodes": [], "extra": 1})}, "extra"),
        ({"a3c": json.dumps({"stats": {"env_steps": -1}})}, "stats.env_steps"),
    ],
)
def test_a_bad_report_is_a_422_that_names_it_and_changes_nothing(
    tmp_path: Path, metadata: dict, named: str
) -> None:
    with master_running(tmp_path) as c:
        before = counters(c)
        r = push(c, 1, metadata=metadata)
        assert r.status_code == 422 and named in r.json()["detail"], r.text
        assert counters(c) == before


def test_a_body_in_another_writers_layout_is_read_too(tmp_path: Path) -> None:
    """safetensors' own writer orders the tensors its way: the general path reads it."""
    with master_running(tmp_path) as c:
        spec = c.app.state.cluster.params.spec
        body = wire.encode({name: torch.full(shape, 1e-3) for name, shape in spec.items()})
        headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": "0", "X-A3C-Seq": "1"}
        r = c.post("/gradients", content=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.headers["X-A3C-Global-Episode"] == "0" and "X-A3C-Best-Score" not in r.headers
