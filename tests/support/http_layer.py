"""What the tests of the HTTP layer (test_http_*.py, test_master_launcher.py) share: both
services in-process (TestClient) with the token and a body limit of LIMIT, and a master whose run's
only worker is the stand-in (`a3c_http.local.cluster.StandInWorker`), reached over loopback
by the real launcher; both services without a token (`open_master`, `open_worker`), answering to
ALLOWED_HOST too; a well-formed body for each route that takes one.

A test module imports the fixtures it uses, and always the autouse `_clean_env`, each as
`from tests.support.http_layer import master as master`: pytest finds fixtures by name in the
module, and the redundant alias tells ruff that the import is meant."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from a3c_http.config.settings import Settings, WorkerSettings
from a3c_http.testing.standin import StandInWorker
from master.app import create_app as create_master
from tests.support.common import AUTH, TOKEN, master_running
from worker.app import create_app as create_worker

LOOPBACK = ("127.0.0.1", 50000)
LIMIT = 256 * 1024  # above every well-formed body of the default model, pickled ones too
ALLOWED_HOST = "a3c.example"  # A3C_ALLOWED_HOSTS of `open_master` and `open_worker`
# A well-formed body per mutating route: a service that judged it before the request's other
# properties (its token, its origin, its content type) would act on it instead of refusing.
GOOD_BODIES: dict[str, Any] = {
    "/episode": {"worker_id": "intruder", "reward": 1e6, "length": 5},
    "/best_score": {"data": 1e6, "worker_id": "intruder"},
    "/global_episode": {"data": 1000},
    "/global_moving_average": {"data": 1e6},
    "/queue": {"data": 1e6},
    "/worker_started": {"worker_id": "intruder", "url": "http://127.0.0.1:9"},
    "/worker_done": {"worker_id": "intruder"},
    "/heartbeat": {"worker_id": "intruder"},
    "/train": {"workers": ["127.0.0.1:9"]},
    "/start_worker": {"master_url": "http://127.0.0.1:9", "worker_id": "intruder",
                      "config": {"num_envs": 1}},
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("A3C_TOKEN", "A3C_MAX_BODY_BYTES", "A3C_MASTER_URL", "A3C_MASTER_RETRY_S",
                 "A3C_ALLOWED_HOSTS"):
        monkeypatch.delenv(name, raising=False)


def settings(tmp_path: Path, **overrides: Any) -> Settings:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "workers.txt").write_text("")
    values: dict[str, Any] = {"token": TOKEN, "run_dir": tmp_path / "run",
                              "workers_file": tmp_path / "workers.txt", **overrides}
    return Settings(**values)


def start_run(
    c: TestClient, workers: list[str], expect: int = 202, **config: Any
) -> dict[str, Any]:
    """POST /train; `expect` 503 when no worker can start (the body still has the results)."""
    body = {"workers": workers, "heartbeat_timeout_s": 3600, "seed": 1, **config}
    reply = c.post("/train", json=body)
    assert reply.status_code == expect, reply.text
    return reply.json()["data"]


@pytest.fixture
def master(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, standin: StandInWorker
) -> Iterator[TestClient]:
    """A master with the token and a body limit of LIMIT, running a run whose only worker is the
    stand-in (it never reports: every counter is the test's)."""
    monkeypatch.setenv("A3C_MAX_BODY_BYTES", str(LIMIT))
    with TestClient(create_master(settings(tmp_path)), client=LOOPBACK, headers=AUTH) as c:
        start_run(c, [standin.url])
        yield c


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("A3C_MAX_BODY_BYTES", str(LIMIT))
    with TestClient(create_worker(token=TOKEN), client=LOOPBACK, headers=AUTH) as c:
        yield c


@pytest.fixture
def open_master(tmp_path: Path) -> Iterator[TestClient]:
    """A master without a token (`tests.support.common.master_running`: a loopback client, a run
    whose workers w1 and w2 have registered), answering to ALLOWED_HOST too."""
    with master_running(tmp_path, allowed_hosts=(ALLOWED_HOST,)) as c:
        yield c


@pytest.fixture
def open_worker() -> Iterator[TestClient]:
    """A worker without a token, answering to ALLOWED_HOST too, to a loopback client."""
    settings = WorkerSettings(token=None, allowed_hosts=(ALLOWED_HOST,))
    with TestClient(create_worker(settings=settings), client=LOOPBACK) as c:
        yield c
