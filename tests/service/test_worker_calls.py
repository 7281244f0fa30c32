"""A worker's calls to its master, in-process (the worker app through TestClient, the master a
peer on loopback that misbehaves, tests/support/badpeer.py): a worker told to stop while its
master's reply trickles in stops at once, and its calls take the environment's proxy only with
A3C_PROXY_FROM_ENV. (Its API and the stop while the master is away:
tests/service/test_worker_api.py.)"""

from __future__ import annotations

import time

import pytest

from tests.support.badpeer import BadPeer, without_proxies
from tests.support.worker_api import _env as _env
from tests.support.worker_api import start_body, wait_for, wait_until, worker


def test_stop_while_the_masters_reply_trickles_in_is_prompt() -> None:
    # The master closes first (the inner context), which also ends the worker's last call to
    # it, POST /worker_done, which a stop does not cut short.
    with worker() as c, BadPeer("trickle", interval_s=0.1) as master:
        assert c.post("/start_worker", json=start_body(master.port)).status_code == 202
        wait_until(lambda: master.sent >= 1)  # the reply to POST /worker_started trickles in
        started = time.monotonic()
        assert c.post("/stop", json={}).status_code == 202
        status = wait_for(c, lambda s: s["state"] not in ("running", "stopping"), timeout_s=10)
        elapsed = time.monotonic() - started
        assert status["state"] == "done" and status["error"] is None, status
        assert elapsed < 2.0, elapsed  # not the attempt's 10 s
        assert master.heads[0].startswith(b"POST /worker_started ")


@pytest.mark.parametrize("from_env", [None, "true"])
def test_the_calls_take_the_environments_proxy_only_with_a3c_proxy_from_env(
    monkeypatch: pytest.MonkeyPatch, from_env: str | None
) -> None:
    without_proxies(monkeypatch)
    if from_env is None:
        monkeypatch.delenv("A3C_PROXY_FROM_ENV", raising=False)
    else:
        monkeypatch.setenv("A3C_PROXY_FROM_ENV", from_env)
    with BadPeer("json") as proxy, BadPeer("json") as master:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        with worker() as c:
            assert c.post("/start_worker", json=start_body(master.port)).status_code == 202
            # Its "{}" is no weights: the worker fails once it asked for them.
            wait_for(c, lambda s: s["state"] == "failed")
    reached, other = (proxy, master) if from_env else (master, proxy)
    assert other.heads == [] and len(reached.heads) >= 2, reached.heads
    target = master.url.encode() if from_env else b""  # a proxy is sent the absolute URL
    assert reached.heads[0].startswith(b"POST %s/worker_started " % target)
    assert reached.heads[1].startswith(b"GET %s/global_model_weights " % target)
