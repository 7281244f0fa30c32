"""What the tests of the worker's API share: the worker app in-process through TestClient, polls
of its status, the body of POST /start_worker, and an environment whose master is never there."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient

from a3c_http.local.cluster import wait_for as poll
from worker.app import create_app

LOOPBACK = ("127.0.0.1", 50000)


def wait_for(
    c: TestClient, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 15.0
) -> dict[str, Any]:
    """Poll GET /status until `predicate` holds; fail with the last status at the deadline."""

    last: list[dict[str, Any]] = []

    def status() -> dict[str, Any] | None:
        r = c.get("/status")
        assert r.status_code == 200, r.text
        last[:] = [r.json()]
        return r.json() if predicate(r.json()) else None

    try:
        return poll(status, timeout_s, "the worker's status", interval_s=0.02)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; last status: {last}") from None


def wait_until(condition: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    return poll(condition, timeout_s, "the condition", interval_s=0.01)


@contextmanager
def worker(
    token: str | None = None, client: tuple[str, int] = LOOPBACK, **kwargs: Any
) -> Iterator[TestClient]:
    with TestClient(create_app(token=token), client=client, **kwargs) as c:
        yield c


def start_body(master_port: int, **overrides: Any) -> dict[str, Any]:
    return {"master_url": f"http://127.0.0.1:{master_port}", "worker_id": "w1", **overrides}


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("A3C_TOKEN", "A3C_MAX_BODY_BYTES"):
        monkeypatch.delenv(name, raising=False)
    # The master of these tests is never there: give up on it quickly.
    monkeypatch.setenv("A3C_MASTER_RETRY_S", "0.2")
