"""The events the master and the workers log (master/run/events.py, worker/app.py,
worker/trainer.py): each once, with its run and worker, in-process (TestClient, a stand-in master
for the trainer)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

import worker.app as worker_app
from a3c_http.algos.registry import train_config
from a3c_http.config.settings import Settings
from a3c_http.local.cluster import free_port, wait_for
from a3c_http.models.actor_critic import build_model
from a3c_http.net.client import MasterClient
from a3c_http.server import logs
from a3c_http.wire import tensors as wire
from master.app import create_app as create_master
from tests.support.common import master_running, push_rollout, registry
from tests.support.log_capture import CapturedEvents
from worker.trainer import Progress, Trainer

LOOPBACK = ("127.0.0.1", 50000)


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("A3C_TOKEN", "A3C_MAX_BODY_BYTES", "A3C_LOG_LEVEL", "A3C_LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("A3C_LOG_PROGRESS_S", "0")  # the tests below drive the progress lines
    monkeypatch.setenv("A3C_MASTER_RETRY_S", "0.3")  # the workers' master is never there


# -- the master -----------------------------------------------------------------------------------


def test_a_run_logs_each_event_once_with_its_run_and_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, captured_events: CapturedEvents
) -> None:
    now = [1_000_000.0]  # the registry's wall clock, moved by hand
    monkeypatch.setattr(time, "time", lambda: now[0])
    config = {
        "heartbeat_interval_s": 1,
        "heartbeat_timeout_s": 5,
        "eval_every_updates": 10**6,  # evaluations are recorded by hand below
        "solved_on": "eval",
        "target_return": 100.0,
    }
    with master_running(tmp_path, workers=2, **config) as c:
        cluster = c.app.state.cluster
        run_id = cluster.ledger.run_id
        for worker in ("w1", "w2"):  # as the launcher says once they accepted: now they count
            cluster.ledger.worker_accepted(worker)
        for seq, (worker, reward) in enumerate([("w1", 10.0), ("w2", 5.0), ("w1", 20.0)], 1):
            assert push_rollout(c, seq, [[reward, 10]], worker=worker).status_code == 200
        now[0] += 4
        c.post("/heartbeat", json={"worker_id": "w1"})
        now[0] += 2  # w2 silent for 6 s
        assert registry(c.get("/status").json())["w2"]["state"] == "lost"
        c.post("/heartbeat", json={"worker_id": "w2"})
        taken = {"model_version": 3, "elapsed_s": 1.0, "global_steps": 30}
        cluster.record_evaluation(run_id, taken, None, "the evaluation process ended")
        result = {"mean_return": 150.0, "std_return": 12.5, "episodes": 10, "mean_length": 150.0}
        cluster.record_evaluation(run_id, taken, result, None)  # solves the run
        c.post("/worker_done", json={"worker_id": "w1"})
        for _ in range(2):  # the second is a retry: the same news, logged once
            c.post("/worker_done", json={"worker_id": "w2", "error": "the env exploded"})
    assert captured_events.names() == [
        "run_started", "worker_joined", "worker_joined", "best_score", "best_score",
        "worker_lost", "worker_back", "evaluation_failed", "evaluation", "solved",
        "run_finished", "worker_done", "worker_failed",
    ]  # fmt: skip
    records = captured_events.records()
    assert {r.run_id for r in records} == {run_id}
    assert [r.worker_id for r in records] == [
        None, "w1", "w2", "w1", "w1", "w2", "w2", None, None, None, None, "w1", "w2",
    ]  # fmt: skip
    assert captured_events.one("evaluation_failed").fields == {
        "model_version": 3,
        "error": "the evaluation process ended",
    }
    started = captured_events.one("run_started").fields
    assert (started["env_id"], started["workers"], started["target_return"]) == (
        "CartPole-v1",
        2,
        100.0,
    )
    raised = captured_events.all("best_score")
    assert [(r.fields["best_score"], r.fields["episode"]) for r in raised] == [(10.0, 1), (20.0, 3)]
    lost = captured_events.one("worker_lost")
    assert lost.levelname == "WARNING" and "heartbeat_timeout_s=5" in lost.fields["reason"]
    evaluation = captured_events.one("evaluation").fields
    assert (evaluation["mean_return"], evaluation["std_return"]) == (150.0, 12.5)
    assert evaluation["model_version"] == 3
    criterion = "mean return of the latest evaluation 150.0 >= 100.0"
    assert captured_events.one("solved").fields == {"criterion": criterion}
    finished = captured_events.one("run_finished").fields
    assert finished["reason"] == f"solved: {criterion}"
    assert (finished["episodes"], finished["env_steps"], finished["best_score"]) == (3, 30, 20.0)
    assert captured_events.one("worker_done").fields == {"episodes": 2, "steps": 20}
    failed = captured_events.one("worker_failed")
    assert failed.levelname == "ERROR" and failed.fields == {"error": "the env exploded"}


def test_a_worker_that_cannot_be_started_and_a_resumed_run_are_logged(
    tmp_path: Path, captured_events: CapturedEvents
) -> None:
    settings = Settings(run_dir=tmp_path / "run", workers_file=tmp_path / "workers.txt")
    body = {"workers": [f"127.0.0.1:{free_port()}"], "master_url": "http://127.0.0.1:1"}
    with TestClient(create_master(settings), client=LOOPBACK) as c:
        r = c.post("/train", json=body)
        assert r.status_code == 503, r.text
        run_id = r.json()["data"]["run_id"]
    assert captured_events.names() == ["run_started", "worker_failed", "run_finished"]
    failed = captured_events.one("worker_failed")
    assert (failed.run_id, failed.worker_id) == (run_id, "w1")
    assert failed.fields["error"].startswith("cannot reach the worker")
    assert captured_events.one("run_finished").fields["reason"] == "no worker could be started"
    with TestClient(create_master(settings), client=LOOPBACK):
        resumed = captured_events.one("run_resumed")
    assert resumed.run_id == run_id and resumed.fields["state"] == "finished"


# -- the worker -----------------------------------------------------------------------------------


def test_a_worker_whose_master_is_gone_logs_the_loss_and_its_failure_once(
    captured_events: CapturedEvents,
) -> None:
    body = {"master_url": f"http://127.0.0.1:{free_port()}", "worker_id": "w7", "run_id": "r9"}
    with TestClient(worker_app.create_app(), client=LOOPBACK) as c:
        assert c.post("/start_worker", json=body).status_code == 202
        failed = wait_for(lambda: captured_events.all("worker_failed"), 15, "worker_failed")[0]
    # Each retry is a DEBUG line, below the default level: the loss is one line.
    assert captured_events.names() == ["worker_started", "master_lost", "worker_failed"]
    assert {(r.run_id, r.worker_id) for r in captured_events.records()} == {("r9", "w7")}
    assert captured_events.one("worker_started").fields["master_url"] == body["master_url"]
    assert "A3C_MASTER_RETRY_S=0.3" in failed.fields["error"]
    assert not failed.exc_info  # an expected failure: no traceback


class FakeTrainer:
    """Blocks until the worker is stopped, or raises when the config's lr is 0.5."""

    def __init__(self, config, client, worker_id, url, stop_event, progress, **kw) -> None:
        self.config, self.stop_event, self.progress = config, stop_event, progress

    def run(self) -> None:
        if self.config.lr == 0.5:
            raise RuntimeError("the environment exploded")
        self.progress.episodes, self.progress.env_steps = 4, 96
        self.stop_event.wait(30)


def test_a_worker_logs_its_end_and_the_traceback_of_a_surprise(
    monkeypatch: pytest.MonkeyPatch, captured_events: CapturedEvents
) -> None:
    monkeypatch.setattr(worker_app, "Trainer", FakeTrainer)
    body = {"master_url": f"http://127.0.0.1:{free_port()}", "worker_id": "w2", "run_id": "r3"}
    with TestClient(worker_app.create_app(), client=LOOPBACK) as c:
        assert c.post("/start_worker", json=body).status_code == 202
        wait_for(lambda: c.get("/status").json()["episodes"] == 4, 15, "the fake trainer")
        c.post("/stop", json={})
        finished = wait_for(lambda: captured_events.all("worker_finished"), 15, "worker_finished")
        assert finished[0].fields == {"reason": "told to stop", "episodes": 4, "env_steps": 96}
        assert c.post("/start_worker", json={**body, "config": {"lr": 0.5}}).status_code == 202
        failed = wait_for(lambda: captured_events.all("worker_failed"), 15, "worker_failed")[0]
    assert failed.fields == {"error": "RuntimeError: the environment exploded"}
    assert failed.exc_info is not None and failed.exc_info[0] is RuntimeError
    assert captured_events.names().count("worker_started") == 2


def test_the_trainer_logs_a_progress_line_every_interval(
    captured_events: CapturedEvents,
) -> None:
    config = train_config(
        seed=3, num_envs=2, t_max=4, max_in_flight=0, heartbeat_interval_s=60,
        heartbeat_timeout_s=120,
    )  # fmt: skip
    model = build_model(config.env_id, config.env_kwargs, config.hidden_sizes)
    layout = wire.Layout.of(model)
    weights = layout.encode(layout.flatten(model.state_dict()))
    pushes = itertools.count(1)

    def master(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/gradients":
            stop = "1" if next(pushes) >= 6 else "0"
            headers = {"X-Model-Version": "1", "X-A3C-Stop": stop}
            return httpx.Response(200, content=weights, headers=headers)
        if request.url.path == "/global_model_weights":
            return httpx.Response(200, content=weights, headers={"X-Model-Version": "0"})
        return httpx.Response(200, json={"data": {}})

    events = logs.Events(logging.getLogger("a3c.worker"), "r1", "w1")
    client = MasterClient("http://master", transport=httpx.MockTransport(master), run_id="r1")
    trainer = Trainer(
        config, client, "w1", None, threading.Event(), Progress(), events=events, progress_s=15
    )
    clock = itertools.count(0.0, 10.0)  # each look at the clock is 10 s later
    trainer.progress_clock = logs.ProgressClock(15, clock=lambda: next(clock))
    trainer.run()  # six rollouts: a line after the second and the fourth
    lines = captured_events.all("progress")
    steps = [r.fields["env_steps"] for r in lines]
    assert len(steps) == 2 and 0 < steps[0] < steps[1]
    rates = [round(steps[0] / 20, 1), round((steps[1] - steps[0]) / 20, 1)]  # per 20 s
    assert [r.fields["steps_per_s"] for r in lines] == rates
    assert {(r.run_id, r.worker_id) for r in lines} == {("r1", "w1")}
    fields = {"episodes", "env_steps", "steps_per_s", "last_return", "updates"}
    assert set(lines[0].fields) == fields
