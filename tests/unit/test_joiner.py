"""A worker that joins by itself (worker/joiner.py) and is given a run it cannot train, here an
environment whose module this host cannot import: it tells the master why (its /status shows the
worker's error, which a3c_http.api's caller sees), and asks again only after a pause, under the same
id, instead of joining again and again at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from a3c_http.algos.registry import train_config
from a3c_http.config.settings import WorkerSettings
from worker.app import WorkerService
from worker.joiner import CannotTrain, Joiner

RUN = {
    "run_id": "r1",
    "worker_id": "w3",
    "config": {**train_config().model_dump(), "env_id": "not_here:Crawl-v0"},
    "exploration": {},
}


class FakeMaster:
    """The joiner's client: every join gives RUN; what the joiner said is recorded."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.joins: list[tuple[Any, ...]] = []
        self.done: list[tuple[str, str | None, str | None]] = []

    def join(self, *args: Any) -> dict[str, Any]:
        self.joins.append(args)
        return {"run": RUN, "retry_s": 2.0}

    def worker_done(self, worker_id: str, error: str | None = None) -> dict[str, Any]:
        self.done.append((worker_id, error, self.run_id))
        return {}

    def close(self) -> None:
        pass


def test_a_worker_that_cannot_make_the_environment_refuses_the_run_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("A3C_ENV_MODULES", "not_here")
    service = WorkerService(WorkerSettings(master_url="http://127.0.0.1:9", token=None))
    with pytest.raises(CannotTrain) as caught:
        service.take(RUN, "http://127.0.0.1:9", None)
    assert str(caught.value) == (
        "this worker cannot train run r1: config.env_id: cannot import 'not_here': "
        "No module named 'not_here'"
    )
    assert service.state == "idle"


def test_the_joiner_tells_the_master_and_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A3C_ENV_MODULES", "not_here")
    service = WorkerService(WorkerSettings(master_url="http://127.0.0.1:9", token=None))
    joiner = Joiner(service)
    joiner._client.close()
    master = FakeMaster()
    joiner._client = master  # type: ignore[assignment]
    asked = threading.Event()
    real_join = master.join

    def join(*args: Any) -> dict[str, Any]:
        asked.set()
        return real_join(*args)

    master.join = join  # type: ignore[method-assign]
    joiner.start()
    assert asked.wait(10)
    time.sleep(0.5)  # a tight loop would ask hundreds of times meanwhile
    joiner.close()
    assert len(master.joins) == 1
    [(worker_id, error, run_id)] = master.done
    assert (worker_id, run_id) == ("w3", "r1") and "cannot import 'not_here'" in (error or "")
    assert joiner.last == ("r1", "w3")  # the next ask takes the same id back
    assert master.run_id is None
