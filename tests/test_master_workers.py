"""The master's view of its workers, in-process (TestClient): the registry (/worker_started,
/worker_done, /workers_status), heartbeats and episodes, and liveness under a controlled clock
(silent workers are lost, and a run nobody runs any more ends)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from a3c_http.localcluster import free_port
from master import routes_run
from tests.master_api_support import (
    OCTET,
    TRAIN,
    episode,
    make_settings,
    master,
    start_run,
    status,
    weights,
)
from tests.master_api_support import _clean_env as _clean_env
from tests.master_api_support import client as client
from tests.master_api_support import launched as launched
from tests.master_api_support import running as running

# -- worker registry -------------------------------------------------------------------------


def test_worker_started_done_and_workers_status(running: TestClient) -> None:
    ws = running.get("/workers_status").json()["data"]
    assert ws["active"] == 2 and ws["done"] is False
    assert {w["worker_id"]: w["state"] for w in ws["workers"]} == {
        "w1": "starting",
        "w2": "starting",
    }

    r = running.post("/worker_started", json={"worker_id": "w1", "url": "http://10.0.0.1:8001"})
    assert r.status_code == 200
    assert r.json()["data"]["state"] == "running"
    ws = running.get("/workers_status").json()["data"]
    states = {w["worker_id"]: w for w in ws["workers"]}
    assert states["w1"]["state"] == "running"
    assert states["w1"]["url"] == "http://10.0.0.1:8001"
    assert ws["active"] == 2

    r = running.post("/worker_done", json={"worker_id": "w1"})
    assert r.status_code == 200
    assert r.json()["data"] == {"worker_id": "w1", "state": "done"}
    ws = running.get("/workers_status").json()["data"]
    assert ws["active"] == 1 and ws["done"] is False
    assert status(running)["state"] == "running"

    r = running.post("/worker_done", json={"worker_id": "w2", "error": "env exploded"})
    assert r.json()["data"]["state"] == "failed"
    ws = running.get("/workers_status").json()["data"]
    assert ws["active"] == 0 and ws["done"] is True
    w2 = next(w for w in ws["workers"] if w["worker_id"] == "w2")
    assert w2["state"] == "failed"
    assert w2["error"] == "env exploded"
    s = status(running)
    assert s["state"] == "finished"  # nobody is left to run it


def test_worker_started_without_a_run_registers_it(client: TestClient) -> None:
    # The seed's registry works on its own: register, see it active, mark it done.
    r = client.post("/worker_started", json={"worker_id": "w1", "url": "http://127.0.0.1:9"})
    assert r.status_code == 200
    data = client.get("/workers_status").json()["data"]
    assert data["active"] == 1 and data["done"] is False
    assert client.post("/worker_done", json={"worker_id": "w1"}).status_code == 200
    data = client.get("/workers_status").json()["data"]
    assert data["active"] == 0 and data["done"] is True
    assert status(client)["state"] == "idle"



def test_worker_started_of_another_run_is_409(running: TestClient) -> None:
    r = running.post("/worker_started", json={"worker_id": "w1", "run_id": "old-run"})
    assert r.status_code == 409
    assert "old-run" in r.json()["detail"]
    assert status(running)["workers"][0]["state"] == "starting"


@pytest.mark.parametrize("body", [{}, {"worker_id": ""}, {"worker_id": "a b"}])
def test_worker_registry_bodies_are_validated(running: TestClient, body: dict) -> None:
    assert running.post("/worker_started", json=body).status_code == 422
    assert running.post("/worker_done", json=body).status_code == 422
    assert running.get("/workers_status").json()["data"]["active"] == 2


def test_weights_after_the_run_do_not_revive_the_registry(client: TestClient) -> None:
    r = client.post("/train", json={**TRAIN, "workers": [f"127.0.0.1:{free_port()}"]})
    assert r.status_code == 503  # no worker could be started: finished at once
    assert status(client)["state"] == "finished"
    _, _, body = weights(client)
    client.post("/local_model_weights?worker_id=ghost&temporary=true", content=body, headers=OCTET)
    ws = client.get("/workers_status").json()["data"]
    assert ws["active"] == 0 and ws["done"] is True


# -- heartbeat and episodes ------------------------------------------------------------------


def test_heartbeat_says_stop_after_post_stop(running: TestClient) -> None:
    r = running.post(
        "/heartbeat",
        json={
            "worker_id": "w1",
            "episodes": 3,
            "steps": 40,
            "steps_per_s": 100.0,
            "future_stat": "ignored",
        },
    )
    assert r.status_code == 200
    assert r.json() == {"data": {"stop": False}}
    w1 = next(w for w in status(running)["workers"] if w["worker_id"] == "w1")
    assert w1["state"] == "running"
    assert running.post("/stop", json={}).status_code == 200
    assert running.post("/heartbeat", json={"worker_id": "w1"}).json() == {"data": {"stop": True}}


def test_heartbeat_validation(running: TestClient) -> None:
    assert running.post("/heartbeat", json={}).status_code == 422
    assert running.post("/heartbeat", json={"worker_id": "w1", "steps": -1}).status_code == 422


def test_heartbeat_without_a_run_says_stop(client: TestClient) -> None:
    assert client.post("/heartbeat", json={"worker_id": "w1"}).json() == {"data": {"stop": True}}


def test_episode_folds_every_statistic(running: TestClient) -> None:
    rewards = [(10.0, 10), (4.0, 7), (25.0, 30)]
    expected_avg = None
    best = None
    for i, (reward, length) in enumerate(rewards, start=1):
        data = episode(running, reward, length, worker_id="w1")
        expected_avg = reward if expected_avg is None else 0.99 * expected_avg + 0.01 * reward
        improved = best is None or reward > best
        best = reward if improved else best
        assert set(data) >= {"global_episode", "moving_average", "best_score", "improved", "stop"}
        assert data["global_episode"] == i
        assert data["moving_average"] == pytest.approx(expected_avg, rel=1e-12)
        assert data["best_score"] == best
        assert data["improved"] is improved
        assert data["stop"] is False
    s = status(running)
    assert s["global_episode"] == 3
    assert s["global_steps"] == 47
    assert s["best_score"] == 25.0
    assert s["moving_average"] == pytest.approx(expected_avg, rel=1e-12)
    assert s["mean_return_100"] == pytest.approx(13.0)
    assert s["queue_length"] == 3
    w1 = next(w for w in s["workers"] if w["worker_id"] == "w1")
    assert (w1["episodes"], w1["steps"], w1["state"]) == (3, 47, "running")
    assert running.get("/global_episode").json()["data"] == 3
    assert running.get("/best_score").json()["data"] == 25.0
    # The FIFO holds the successive averages, oldest first.
    assert running.get("/queue").json()["data"] == 10.0
    assert running.get("/queue").json()["data"] == pytest.approx(0.99 * 10.0 + 0.01 * 4.0)


def test_episode_stops_the_run_at_max_episodes(client: TestClient, launched: list) -> None:
    start_run(client, max_episodes=3)
    assert episode(client, 1.0)["stop"] is False
    assert episode(client, 2.0)["stop"] is False
    last = episode(client, 3.0)
    assert last["stop"] is True and last["global_episode"] == 3
    s = status(client)
    assert s["state"] == "finished"
    assert "max_episodes" in s["finish_reason"]
    # An episode that ended just after the finish still happened: it is counted, once, and the
    # reply tells its worker to stop.
    late = client.post("/episode", json={"worker_id": "w1", "reward": 1.0, "length": 1})
    assert late.status_code == 200
    assert late.json()["data"]["stop"] is True
    assert status(client)["global_episode"] == 4
    assert status(client)["state"] == "finished"
    other = {"worker_id": "w1", "reward": 1.0, "length": 1, "run_id": "an-earlier-run"}
    assert client.post("/episode", json=other).status_code == 409
    assert status(client)["global_episode"] == 4
    assert client.post("/heartbeat", json={"worker_id": "w1"}).json()["data"]["stop"] is True


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import master.ledger

        self.now = 1_000_000.0
        monkeypatch.setattr(master.ledger.time, "time", lambda: self.now)


def worker_states(c: TestClient) -> dict[str, str]:
    return {w["worker_id"]: w["state"] for w in status(c)["workers"]}


def test_silent_workers_are_lost_and_the_run_ends(
    client: TestClient, launched: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    start_run(client, heartbeat_interval_s=1, heartbeat_timeout_s=5)
    clock.now += 4
    client.post("/heartbeat", json={"worker_id": "w1"})
    assert worker_states(client) == {"w1": "running", "w2": "starting"}
    clock.now += 2  # w2 silent for 6 s, w1 for 2 s
    s = status(client)
    assert {w["worker_id"]: w["state"] for w in s["workers"]} == {"w1": "running", "w2": "lost"}
    w2 = next(w for w in s["workers"] if w["worker_id"] == "w2")
    assert "heartbeat_timeout_s=5" in w2["error"]
    assert s["state"] == "running"
    # A late message of a lost worker brings it back while the run goes on, counted once.
    assert client.post("/episode", json={"worker_id": "w2", "reward": 1.0, "length": 3},
                       headers={"X-A3C-Seq": "1"}).status_code == 200
    assert worker_states(client)["w2"] == "running"
    clock.now += 6
    s = status(client)
    assert s["state"] == "finished" and s["finish_reason"] == "no worker is running any more"
    assert set(worker_states(client).values()) == {"lost"}
    assert s["global_episode"] == 1


def test_a_worker_is_not_judged_while_the_master_waits_for_its_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    answered = []

    def slow_launch(
        state, workers, run_id, config, master_url, token, timeout_s=10.0, **options
    ):
        clock.now += 50  # /start_worker takes longer than the heartbeat timeout
        state.check_liveness()
        answered.append(dict(state.status()["workers"][0]))
        for wid in workers:
            state.worker_accepted(wid)
        return [{"url": u, "worker_id": w, "started": True, "error": None}
                for w, u in workers.items()]

    monkeypatch.setattr(routes_run, "launch", slow_launch)
    with master(make_settings(tmp_path)) as c:
        start_run(c, workers=["127.0.0.1:9001"], heartbeat_interval_s=1, heartbeat_timeout_s=5)
        assert answered[0]["state"] == "starting"
        assert status(c)["state"] == "running"
        clock.now += 6  # it accepted, then said nothing for longer than the timeout
        assert worker_states(c) == {"w1": "lost"}


def test_start_timeout_gives_starting_workers_longer(
    client: TestClient, launched: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    start_run(client, heartbeat_interval_s=0.5, heartbeat_timeout_s=2, start_timeout_s=30)
    clock.now += 10
    assert worker_states(client) == {"w1": "starting", "w2": "starting"}
    client.post("/heartbeat", json={"worker_id": "w1"})
    clock.now += 3  # w1 now runs: its heartbeat timeout applies
    assert worker_states(client) == {"w1": "lost", "w2": "starting"}
    clock.now += 18
    assert worker_states(client) == {"w1": "lost", "w2": "lost"}
    assert "start_timeout_s=30" in status(client)["workers"][1]["error"]
