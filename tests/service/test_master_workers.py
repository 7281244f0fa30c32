"""The master's view of its workers, in-process (TestClient): the registry (/worker_started,
/worker_done, /workers_status), heartbeats and episodes, and liveness under a controlled clock
(silent workers are lost, and a run nobody runs any more ends)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from a3c_http.local.cluster import free_port
from master.api import run as routes_run
from tests.support.master_api import (
    OCTET,
    TRAIN,
    episode,
    make_settings,
    master,
    start_run,
    status,
    weights,
)
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import client as client
from tests.support.master_api import launched as launched
from tests.support.master_api import running as running

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
    # The original design's registry works on its own: register, see it active, mark it done.
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
        import master.run.ledger

        self.now = 1_000_000.0
        monkeypatch.setattr(master.run.ledger.time, "time", lambda: self.now)


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


# -- workers that join by themselves (POST /join) ----------------------------------------------


def join(c: TestClient, name: str, **fields: object) -> dict:
    r = c.post("/join", json={"name": name, **fields})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_a_run_without_workers_waits_for_joiners_who_get_ids_configs_and_their_exploration(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    assert join(client, "pod-a") == {"run": None, "retry_s": routes_run.JOIN_RETRY_S}
    assert status(client)["waiting_workers"] == ["pod-a"]
    data = start_run(
        client, workers=[], entropy_coef=0.01, entropy_coef_max=0.03, heartbeat_timeout_s=5
    )
    assert data["workers"] == [] and "waits for workers that join" in data["note"]
    clock.now += 60  # nobody for longer than any timeout: the run waits on
    assert status(client)["state"] == "running" and status(client)["waits_for_workers"]

    first = join(client, "pod-a", url="http://10.0.0.7:8001")["run"]
    second = join(client, "pod-b")["run"]
    assert (first["worker_id"], second["worker_id"]) == ("w1", "w2")
    assert first["run_id"] == second["run_id"] == data["run_id"]
    assert first["config"]["entropy_coef_max"] == 0.03
    assert [first["exploration"]["entropy_coef"], second["exploration"]["entropy_coef"]] == [
        0.01, 0.03,
    ]  # the ends of the range, from their order alone
    shown = {w["worker_id"]: w for w in status(client)["workers"]}
    assert shown["w1"]["origin"] == "joined" and shown["w1"]["name"] == "pod-a"
    assert shown["w1"]["url"] == "http://10.0.0.7:8001" and status(client)["waiting_workers"] == []

    # One leaves (SIGTERM: it says it is done), one vanishes: the run still waits for others.
    client.post("/worker_done", json={"worker_id": "w1", "run_id": data["run_id"]})
    clock.now += 6
    assert worker_states(client) == {"w1": "done", "w2": "lost"}
    assert status(client)["state"] == "running"
    metrics = client.get("/metrics").text  # who joined and who left, for Prometheus
    assert 'a3c_workers_by_origin{origin="joined",state="done"} 1.0' in metrics
    assert 'a3c_workers_by_origin{origin="joined",state="lost"} 1.0' in metrics
    # w2 comes back under its id (a restarted trainer, or master); a new pod gets a new id.
    again = join(client, "pod-b", run_id=data["run_id"], worker_id="w2")["run"]
    assert again["worker_id"] == "w2" and again["exploration"] == second["exploration"]
    assert join(client, "pod-c", run_id="an-old-run", worker_id="w2")["run"]["worker_id"] == "w3"
    assert worker_states(client) == {"w1": "done", "w2": "starting", "w3": "starting"}
    client.post("/heartbeat", json={"worker_id": "w3"})
    assert worker_states(client)["w3"] == "running"


def test_launched_and_joined_workers_share_a_run(client: TestClient, launched: list) -> None:
    start_run(client)  # w1, w2 from the list
    master_state = client.app.state.cluster
    master_state.ledger.workers.records["w2"].launching = True  # as while POST /start_worker
    assert join(client, "late")["run"] is None  # is on its way: w2 may be this very worker
    master_state.ledger.worker_accepted("w2")
    joined = join(client, "late")["run"]
    assert joined["worker_id"] == "w3"
    origins = {w["worker_id"]: w["origin"] for w in status(client)["workers"]}
    assert origins == {"w1": "launched", "w2": "launched", "w3": "joined"}


def test_the_default_workers_file_may_be_missing_a_named_one_may_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no workers.txt here
    default = type(make_settings(tmp_path))(run_dir=tmp_path / "run")  # A3C_WORKERS_FILE unset
    with master(default) as c:
        r = c.post("/train", json={"master_url": "http://127.0.0.1:33333"})
        assert r.status_code == 202 and r.json()["data"]["workers"] == [], r.text
        c.post("/stop")
    with master(make_settings(tmp_path)) as c:  # names tmp_path/workers.txt, which is absent
        r = c.post("/train", json={"master_url": "http://127.0.0.1:33333"})
        assert r.status_code == 422 and "cannot read the workers file" in r.text


def test_a_resumed_run_still_waits_and_knows_who_joined(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with master(settings) as c:
        run_id = start_run(c, workers=[])["run_id"]
        assert join(c, "pod-a")["run"]["worker_id"] == "w1"
    with master(settings) as c:  # the same folder: the run is taken up
        s = status(c)
        assert s["run_id"] == run_id and s["waits_for_workers"]
        assert [(w["worker_id"], w["origin"], w["name"]) for w in s["workers"]] == [
            ("w1", "joined", "pod-a")
        ]
        assert join(c, "pod-a", run_id=run_id, worker_id="w1")["run"]["worker_id"] == "w1"
