"""Retries are counted once: episodes, gradients and global weights numbered with X-A3C-Seq
are taken once per worker and number, a retry gets the first answer again, and the numbers
survive a restart of the master. In-process (TestClient)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from a3c_http.wire import tensors as wire
from tests.support.master_api import (
    OCTET,
    gradients_like,
    make_settings,
    master,
    ones_like,
    start_run,
    status,
    weights,
)
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import client as client
from tests.support.master_api import launched as launched
from tests.support.master_api import running as running


def seq_episode(c: TestClient, seq: int, reward: float, length: int = 10, worker_id: str = "w1"):
    return c.post(
        "/episode",
        json={"worker_id": worker_id, "reward": reward, "length": length},
        headers={"X-A3C-Seq": str(seq)},
    )


def worker_record(c: TestClient, worker_id: str) -> dict[str, Any]:
    return next(w for w in status(c)["workers"] if w["worker_id"] == worker_id)


def test_a_retried_episode_is_counted_once(running: TestClient) -> None:
    first = seq_episode(running, 1, 10.0, 12)
    assert first.status_code == 200
    assert first.json()["data"]["duplicate"] is False
    again = seq_episode(running, 1, 10.0, 12)  # the reply was lost; the worker retries
    assert again.status_code == 200
    assert again.json()["data"] == {**first.json()["data"], "duplicate": True}
    older = seq_episode(running, 1, 99.0, 50)  # any number already used is not counted
    assert older.json()["data"]["duplicate"] is True
    s = status(running)
    assert (s["global_episode"], s["global_steps"], s["best_score"]) == (1, 12, 10.0)
    assert s["queue_length"] == 1
    record = worker_record(running, "w1")
    assert (record["episodes"], record["last_seq"], record["duplicates"]) == (1, 1, 2)
    # The next number is counted, and numbers are per worker.
    assert seq_episode(running, 2, 20.0, 5).json()["data"]["global_episode"] == 2
    assert seq_episode(running, 1, 30.0, 5, worker_id="w2").json()["data"]["global_episode"] == 3
    assert status(running)["best_score"] == 30.0


def test_a_retried_gradient_is_applied_once(running: TestClient) -> None:
    tensors, version, _ = weights(running)
    body = wire.encode(gradients_like(tensors))
    headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": str(version), "X-A3C-Seq": "5"}
    first = running.post("/gradients", content=body, headers=headers)
    assert first.status_code == 200 and "X-A3C-Duplicate" not in first.headers
    again = running.post("/gradients", content=body, headers=headers)
    assert again.status_code == 200
    assert again.headers["X-A3C-Duplicate"] == "1"
    assert again.headers["X-Model-Version"] == first.headers["X-Model-Version"] == "1"
    assert again.content == first.content
    s = status(running)
    assert (s["model_version"], s["updates_applied"], s["updates_rejected"]) == (1, 1, 0)
    assert worker_record(running, "w1")["duplicates"] == 1
    # Another worker's number 5 is its own.
    other = {**headers, "X-Worker-Id": "w2", "X-Model-Version": "1"}
    assert running.post("/gradients", content=body, headers=other).status_code == 200
    assert status(running)["updates_applied"] == 2


def test_a_retry_after_the_finish_still_learns_its_update_was_taken(running: TestClient) -> None:
    tensors, version, _ = weights(running)
    body = wire.encode(gradients_like(tensors))
    headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": str(version), "X-A3C-Seq": "1"}
    assert running.post("/gradients", content=body, headers=headers).status_code == 200
    assert running.post("/stop", json={}).status_code == 200
    again = running.post("/gradients", content=body, headers=headers)
    assert again.status_code == 200 and again.headers["X-A3C-Duplicate"] == "1"
    later = running.post("/gradients", content=body, headers={**headers, "X-A3C-Seq": "2"})
    assert later.status_code == 409 and later.headers["X-A3C-Stop"] == "1"
    assert status(running)["updates_applied"] == 1


def test_a_retried_stale_gradient_is_refused_again(client: TestClient, launched: list) -> None:
    start_run(client, max_staleness=0)
    tensors, _, _ = weights(client)
    body = wire.encode(gradients_like(tensors))
    headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": "0"}
    assert client.post("/gradients", content=body, headers=headers).status_code == 200
    stale = {**headers, "X-A3C-Seq": "2"}
    assert client.post("/gradients", content=body, headers=stale).status_code == 409
    assert client.post("/gradients", content=body, headers=stale).status_code == 409
    s = status(client)
    assert (s["updates_applied"], s["updates_rejected"]) == (1, 2)


def test_retried_global_weights_are_taken_once(running: TestClient) -> None:
    tensors, version, _ = weights(running)
    body = wire.encode(ones_like(tensors, 0.5))
    params = {"worker_id": "w1", "temporary": "false"}
    for duplicate in (False, True):
        r = running.post(
            "/local_model_weights", params=params, content=body, headers={**OCTET, "X-A3C-Seq": "3"}
        )
        assert r.status_code == 200, r.text
        assert r.json()["data"] == {
            "model_version": version + 1,
            "temporary": False,
            "duplicate": duplicate,
        }
    assert status(running)["updates_applied"] == 1


@pytest.mark.parametrize("seq", ["0", "-1", "x", "1.5", str(2**63)])
def test_a_bad_seq_is_422_and_counts_nothing(running: TestClient, seq: str) -> None:
    r = running.post(
        "/episode",
        json={"worker_id": "w1", "reward": 1.0, "length": 1},
        headers={"X-A3C-Seq": seq},
    )
    assert r.status_code == 422
    assert "X-A3C-Seq" in r.json()["detail"]
    assert status(running)["global_episode"] == 0


def test_sequence_numbers_survive_a_restart(tmp_path: Path, launched: list) -> None:
    settings = make_settings(tmp_path)
    with master(settings) as c:
        start_run(c)
        assert seq_episode(c, 1, 10.0).status_code == 200
        tensors, version, _ = weights(c)
        headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": str(version), "X-A3C-Seq": "2"}
        body = wire.encode(gradients_like(tensors))
        assert c.post("/gradients", content=body, headers=headers).status_code == 200
    with master(settings) as c:
        assert seq_episode(c, 1, 10.0).json()["data"]["duplicate"] is True
        r = c.post("/gradients", content=body, headers=headers)
        assert r.headers["X-A3C-Duplicate"] == "1"
        s = status(c)
        assert (s["global_episode"], s["updates_applied"]) == (1, 1)
