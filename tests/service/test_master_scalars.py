"""The master's original design's scalars, in-process (TestClient): /best_score only rises,
/global_episode counts, /global_moving_average folds, and /queue is a bounded FIFO that counts
what it drops."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from a3c_http.config.settings import Settings
from master.app import create_app
from tests.support.master_api import LOOPBACK, make_settings, master, status
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import client as client


def test_best_score_only_rises(client: TestClient) -> None:
    assert client.get("/best_score").json() == {"data": None}
    r = client.post("/best_score", json={"data": 10.0, "worker_id": "w1"})
    assert r.status_code == 200
    assert r.json() == {"data": 10.0, "raised": True}
    assert client.post("/best_score", json={"data": 3.5}).json() == {"data": 10.0, "raised": False}
    assert client.post("/best_score", json={"data": 10.0}).json()["raised"] is False
    assert client.get("/best_score").json() == {"data": 10.0}
    assert client.post("/best_score", json={"data": 12.5}).json() == {"data": 12.5, "raised": True}
    assert client.get("/best_score").json()["data"] == 12.5
    assert status(client)["best_score"] == 12.5


@pytest.mark.parametrize(
    "body", [{}, {"data": "high"}, {"data": 1.0, "worker_id": "bad id!"}, {"data": None}]
)
def test_best_score_rejects_bad_bodies(client: TestClient, body: dict) -> None:
    r = client.post("/best_score", json=body)
    assert r.status_code == 422
    assert r.json()["detail"]
    assert client.get("/best_score").json()["data"] is None


def test_global_episode_counts(client: TestClient) -> None:
    assert client.get("/global_episode").json() == {"data": 0}
    assert client.post("/global_episode", json={}).json() == {"data": 1}
    assert client.post("/global_episode", json={"data": 5}).json() == {"data": 6}
    assert client.post("/global_episode", json={}).json() == {"data": 7}
    assert client.get("/global_episode").json() == {"data": 7}
    for bad in ({"data": 0}, {"data": -2}, {"data": "many"}):
        r = client.post("/global_episode", json=bad)
        assert r.status_code == 422, bad
        assert "data" in r.json()["detail"]
    assert client.get("/global_episode").json() == {"data": 7}
    assert status(client)["global_episode"] == 7


def test_global_moving_average_folds(client: TestClient) -> None:
    assert client.get("/global_moving_average").json() == {"data": None}
    assert client.post("/global_moving_average", json={"data": 10.0}).json() == {"data": 10.0}
    expected = 10.0
    for reward in (20.0, -5.0, 100.0):
        expected = 0.99 * expected + 0.01 * reward
        got = client.post("/global_moving_average", json={"data": reward}).json()["data"]
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert client.get("/global_moving_average").json()["data"] == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(10.84951, abs=1e-9)  # 10 -> 10.1 -> 9.949 -> 10.84951
    assert status(client)["moving_average"] == pytest.approx(expected, rel=1e-12)


def test_queue_is_fifo_and_empty_is_200(client: TestClient) -> None:
    assert client.get("/queue").json() == {"data": None, "empty": True}
    for i, value in enumerate((3.0, 1.0, 0.0, -2.5), start=1):
        r = client.post("/queue", json={"data": value})
        assert r.status_code == 200
        assert r.json()["data"]["length"] == i
    assert status(client)["queue_length"] == 4
    popped = [client.get("/queue").json() for _ in range(5)]
    assert popped == [
        {"data": 3.0, "empty": False},
        {"data": 1.0, "empty": False},
        {"data": 0.0, "empty": False},
        {"data": -2.5, "empty": False},
        {"data": None, "empty": True},
    ]


def test_create_queue_empties_it(client: TestClient) -> None:
    for value in (1.0, 2.0):
        client.post("/queue", json={"data": value})
    r = client.post("/create_queue", json={})
    assert r.status_code == 200
    assert r.json()["data"]["length"] == 0
    assert status(client)["queue_length"] == 0
    assert client.get("/queue").json() == {"data": None, "empty": True}


def test_queue_is_bounded_and_counts_drops(tmp_path: Path) -> None:
    with master(make_settings(tmp_path, queue_max=3)) as c:
        for value in range(5):
            assert c.post("/queue", json={"data": float(value)}).json()["data"]["length"] <= 3
        s = status(c)
        assert s["queue_length"] == 3
        assert s["queue_dropped"] == 2
        assert [c.get("/queue").json()["data"] for _ in range(4)] == [2.0, 3.0, 4.0, None]


def test_a_fractional_queue_max_is_refused_or_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A3C_QUEUE_MAX", "0.5")
    monkeypatch.setenv("A3C_RUN_DIR", str(tmp_path / "run"))
    try:
        settings = Settings.from_env()
    except ValueError as exc:  # refusing it at start-up, naming the variable, is fine too
        assert "A3C_QUEUE_MAX" in str(exc)
        return
    with TestClient(create_app(settings), client=LOOPBACK, raise_server_exceptions=False) as c:
        assert c.post("/queue", json={"data": 1.0}).status_code == 200
