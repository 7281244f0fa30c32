"""The worker's HTTP API, in-process through TestClient, checked against docs/http-api.md.

Training itself is replaced by a fake `worker.app.Trainer` where a test needs a worker that stays
running; the master it reports to is a closed loopback port, so every call to it fails fast.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.openapi.utils import get_openapi
from fastapi.testclient import TestClient

import worker.app as worker_app
from a3c_http.local.cluster import free_port
from tests.support.schema_checks import assert_bearer_everywhere_but_healthz, assert_errors_declared
from tests.support.worker_api import LOOPBACK, start_body, wait_for, wait_until, worker
from tests.support.worker_api import _env as _env
from worker.app import create_app

REMOTE = ("10.1.2.3", 5)
STATUS_FIELDS = {
    "state",
    "worker_id",
    "master_url",
    "episodes",
    "steps",
    "last_reward",
    "steps_per_s",
    "error",
}
ROUTES = [("GET", "/status"), ("POST", "/start_worker"), ("POST", "/stop")]


@pytest.fixture
def client() -> Iterator[TestClient]:
    with worker() as c:
        yield c


class FakeTrainer:
    """Stands in for worker.trainer.Trainer: reports some progress, then blocks until stopped."""

    instances: list[FakeTrainer] = []

    def __init__(
        self, config, client, worker_id, worker_url, stop_event, progress, log_std_offset=0.0, **kw
    ) -> None:
        self.config = config
        self.log_std_offset = log_std_offset
        self.worker_id = worker_id
        self.stop_event = stop_event
        self.progress = progress
        self.running = threading.Event()
        FakeTrainer.instances.append(self)

    def run(self) -> None:
        self.progress.episodes = 3
        self.progress.steps = 120
        self.progress.last_reward = 42.0
        self.progress.steps_per_s = 99.5
        self.running.set()
        if not self.stop_event.wait(30):
            raise RuntimeError("FakeTrainer was never stopped")


@pytest.fixture
def fake_trainer(monkeypatch: pytest.MonkeyPatch) -> type[FakeTrainer]:
    monkeypatch.setattr(FakeTrainer, "instances", [])
    monkeypatch.setattr(worker_app, "Trainer", FakeTrainer)
    return FakeTrainer


# -- health and status -----------------------------------------------------------------------


def test_healthz(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_status_idle(client: TestClient) -> None:
    r = client.get("/status")
    assert r.status_code == 200
    status = r.json()
    assert set(status) >= STATUS_FIELDS
    assert status["state"] == "idle"
    assert status["worker_id"] is None and status["master_url"] is None
    assert status["episodes"] == 0 and status["steps"] == 0
    assert status["last_reward"] is None and status["error"] is None


def test_stop_while_idle_is_202_and_stays_idle(client: TestClient) -> None:
    r = client.post("/stop", json={})
    assert r.status_code == 202
    assert client.get("/status").json()["state"] == "idle"


# -- start_worker ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"worker_id": "w1"}, "master_url"),
        ({"master_url": "http://127.0.0.1:1"}, "worker_id"),
        ({"master_url": "ftp://127.0.0.1:1", "worker_id": "w1"}, "master_url"),
        ({"master_url": "http://127.0.0.1:1", "worker_id": "w 1"}, "worker_id"),
        ({"master_url": "http://127.0.0.1:1", "worker_id": "w1", "bogus": 1}, "bogus"),
        ({"master_url": "http://127.0.0.1:1", "worker_id": "w1", "config": {"lr": -1}}, "lr"),
        (
            {
                "master_url": "http://127.0.0.1:1",
                "worker_id": "w1",
                "exploration": {"log_std_offset": 5},
            },
            "log_std_offset",
        ),
        (
            {
                "master_url": "http://127.0.0.1:1",
                "worker_id": "w1",
                "config": {"env_id": "NoSuchEnv-v9"},
            },
            "env_id",
        ),
    ],
)
def test_start_worker_bad_body_is_422(client: TestClient, body: dict, field: str) -> None:
    r = client.post("/start_worker", json=body)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]
    assert client.get("/status").json()["state"] == "idle"


def test_start_worker_non_finite_config_is_422(client: TestClient) -> None:
    r = client.post(
        "/start_worker",
        content=b'{"master_url": "http://127.0.0.1:1", "worker_id": "w1", "config": {"lr": NaN}}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert client.get("/status").json()["state"] == "idle"


def test_unreachable_master_fails_the_worker(client: TestClient) -> None:
    port = free_port()
    r = client.post("/start_worker", json=start_body(port, worker_id="w7"))
    assert r.status_code == 202, r.text
    assert r.json()["data"]["worker_id"] == "w7"
    status = wait_for(client, lambda s: s["state"] not in ("running", "stopping"))
    assert status["state"] == "failed"
    assert status["worker_id"] == "w7"
    assert status["master_url"] == f"http://127.0.0.1:{port}"
    assert "worker_started" in status["error"]  # the call that could not reach the master
    assert f"127.0.0.1:{port}" in status["error"] or "master" in status["error"].lower()
    # A failed worker can be started again.
    again = client.post("/start_worker", json=start_body(port, worker_id="w8"))
    assert again.status_code == 202
    assert wait_for(client, lambda s: s["state"] == "failed")["worker_id"] == "w8"


def test_second_start_while_running_is_409_and_stop_ends_it(
    client: TestClient, fake_trainer: type[FakeTrainer]
) -> None:
    port = free_port()
    body = start_body(port, config={"lr": 0.005, "num_envs": 2}, run_id="run-1")
    r = client.post("/start_worker", json=body)
    assert r.status_code == 202, r.text
    assert r.json()["data"]["state"] == "running"
    (trainer,) = wait_until(lambda: fake_trainer.instances)
    assert trainer.running.wait(10), "the trainer thread never ran"
    assert trainer.worker_id == "w1"
    assert trainer.config.lr == 0.005 and trainer.config.num_envs == 2

    status = client.get("/status").json()
    assert status["state"] == "running"
    assert status["master_url"] == f"http://127.0.0.1:{port}"
    assert (status["episodes"], status["steps"], status["last_reward"]) == (3, 120, 42.0)
    assert status["steps_per_s"] == 99.5

    second = client.post("/start_worker", json=start_body(port, worker_id="w2"))
    assert second.status_code == 409
    assert "running" in second.json()["detail"]
    assert len(fake_trainer.instances) == 1
    assert client.get("/status").json()["worker_id"] == "w1"

    stop = client.post("/stop", json={})
    assert stop.status_code == 202
    assert stop.json()["data"]["state"] in ("stopping", "done")
    assert trainer.stop_event.is_set()
    status = wait_for(client, lambda s: s["state"] not in ("running", "stopping"))
    assert status["state"] == "done"
    assert status["error"] is None
    assert status["episodes"] == 3

    # Done: the slot is free for the next run.
    third = client.post("/start_worker", json=start_body(port, worker_id="w3"))
    assert third.status_code == 202
    wait_until(lambda: len(fake_trainer.instances) == 2)
    client.post("/stop", json={})
    assert wait_for(client, lambda s: s["state"] == "done")["worker_id"] == "w3"


def test_the_start_requests_exploration_is_trained_with_and_shown(
    client: TestClient, fake_trainer: type[FakeTrainer]
) -> None:
    mine = {"entropy_coef": 0.04, "log_std_offset": 0.5, "epsilon": None}
    # Without one (an older master, curl): the config's entropy_coef and no offset.
    default = {"entropy_coef": 0.01, "log_std_offset": 0.0, "epsilon": None}
    for sent, used in ((mine, mine), (None, default)):
        body = start_body(free_port(), config={"entropy_coef": 0.01})
        if sent:
            body["exploration"] = sent
        started = len(fake_trainer.instances)
        assert client.post("/start_worker", json=body).status_code == 202
        assert client.get("/status").json()["exploration"] == used
        trainer = wait_until(lambda n=started: fake_trainer.instances[n:])[0]
        assert trainer.config.entropy_coef == used["entropy_coef"]
        assert trainer.log_std_offset == used["log_std_offset"]
        client.post("/stop", json={})
        wait_for(client, lambda s: s["state"] == "done")


def test_trainer_exception_fails_the_worker(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Exploding(FakeTrainer):
        def run(self) -> None:
            raise RuntimeError("environment exploded")

    monkeypatch.setattr(worker_app, "Trainer", Exploding)
    assert client.post("/start_worker", json=start_body(free_port())).status_code == 202
    status = wait_for(client, lambda s: s["state"] == "failed")
    assert "environment exploded" in status["error"]
    assert "RuntimeError" in status["error"]


# -- auth ------------------------------------------------------------------------------------


def test_right_token_is_served_from_anywhere(fake_trainer: type[FakeTrainer]) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    with worker(token="s3cret", client=REMOTE, headers=auth) as c:
        assert c.get("/status").json()["state"] == "idle"
        r = c.post("/start_worker", json=start_body(free_port()))
        assert r.status_code == 202
        assert c.post("/stop", json={}).status_code == 202
        wait_for(c, lambda s: s["state"] == "done")


def test_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A3C_TOKEN", "from-env")
    with worker(token=None) as c:
        assert c.get("/status").status_code == 401
        ok = c.get("/status", headers={"Authorization": "Bearer from-env"})
        assert ok.status_code == 200


@pytest.mark.parametrize("method_path", ROUTES)
def test_without_token_remote_clients_get_403(method_path: tuple[str, str]) -> None:
    method, path = method_path
    with worker(client=REMOTE) as c:
        r = c.request(method, path)
        assert r.status_code == 403
        assert "A3C_TOKEN" in r.json()["detail"]
        assert c.get("/healthz").status_code == 200


# -- settings ------------------------------------------------------------------------------------


def test_a_bad_setting_stops_the_worker_at_start_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a worker that starts and fails its first run: it does not start."""
    monkeypatch.setenv("A3C_TORCH_THREADS", "abc")
    with pytest.raises(ValueError, match="A3C_TORCH_THREADS='abc'"):
        create_app()
    with pytest.raises(SystemExit) as info:
        worker_app.__getattr__("app")  # what `uvicorn worker.app:app` does
    message = str(info.value.code)
    assert message.startswith("a3c-http worker: A3C_TORCH_THREADS='abc'"), message
    assert "\n" not in message


def test_the_torch_threads_setting_reaches_the_training_thread(
    monkeypatch: pytest.MonkeyPatch, fake_trainer: type[FakeTrainer]
) -> None:
    monkeypatch.setenv("A3C_TORCH_THREADS", "3")
    seen: list[int] = []
    monkeypatch.setattr(worker_app.torch, "set_num_threads", seen.append)
    with worker() as c:
        assert c.post("/start_worker", json=start_body(free_port())).status_code == 202
        (trainer,) = wait_until(lambda: fake_trainer.instances)
        assert trainer.running.wait(10)
        assert seen == [3]
        c.post("/stop", json={})


# -- stopping while the master is away -----------------------------------------------------------


def _start_against_an_absent_master(c: TestClient) -> None:
    assert c.post("/start_worker", json=start_body(free_port())).status_code == 202
    # The master is not there: the worker is in its retry loop (A3C_MASTER_RETRY_S=60).
    wait_for(c, lambda s: s["http_retries"] >= 1 and s["state"] == "running")


def test_stop_while_the_master_is_away_is_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A3C_MASTER_RETRY_S", "60")
    with worker() as c:
        _start_against_an_absent_master(c)
        started = time.monotonic()
        assert c.post("/stop", json={}).status_code == 202
        status = wait_for(c, lambda s: s["state"] not in ("running", "stopping"), timeout_s=10)
        assert time.monotonic() - started < 10
        assert status["state"] == "done", status  # it was told to stop: not a failure
        assert status["error"] is None


def test_shutdown_while_the_master_is_away_is_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM (uvicorn's shutdown runs the lifespan's end) does not wait out the retries."""
    monkeypatch.setenv("A3C_MASTER_RETRY_S", "60")
    app = create_app()
    with TestClient(app, client=LOOPBACK) as c:
        _start_against_an_absent_master(c)
        started = time.monotonic()
    assert time.monotonic() - started < 10
    assert app.state.worker.state == "done"


# -- the OpenAPI schema ----------------------------------------------------------------------------


def test_the_routes_themselves_declare_every_error_and_the_token() -> None:
    app = create_app(token="s3cret")
    from_routes = get_openapi(title=app.title, version=app.version, routes=app.routes)
    assert app.openapi()["paths"] == from_routes["paths"]
    assert_errors_declared(from_routes, {("POST", "/start_worker")})
    assert_bearer_everywhere_but_healthz(from_routes)
