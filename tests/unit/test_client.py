"""MasterClient against httpx.MockTransport: retries, the error hierarchy, and a stop while the
master is away (its messages: tests/unit/test_client_messages.py); and against a master that
misbehaves on a loopback port (tests/support/badpeer.py): each attempt's deadline, its size bound
and a stop while the reply trickles in, and which proxy its calls take."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from a3c_http.local.cluster import wait_for
from a3c_http.net.client import (
    A3CError,
    Conflict,
    MasterClient,
    MasterRejected,
    MasterUnavailable,
    ProtocolError,
    Stopped,
    Unauthorized,
)
from tests.support.badpeer import BadPeer, without_proxies
from tests.support.client import LAYOUT, TENSORS, Recorder, make_client, ok_health

# -- retries --------------------------------------------------------------------------------------


def test_retries_5xx_then_succeeds() -> None:
    handler = Recorder(
        httpx.Response(503, text="busy"), httpx.Response(500, json={"detail": "x"}), ok_health()
    )
    with make_client(handler) as client:
        assert client.healthz() is True
    assert handler.calls == 3
    assert all(r.url.path == "/healthz" for r in handler.requests)


def test_gives_up_after_the_retry_deadline() -> None:
    handler = Recorder(httpx.Response(502, json={"detail": "bad gateway upstream"}))
    client = make_client(handler, backoff_s=0.01, max_backoff_s=0.01, retry_deadline_s=0.1)
    start = time.monotonic()
    with pytest.raises(MasterUnavailable) as info:
        client.status()
    elapsed = time.monotonic() - start
    assert isinstance(info.value, A3CError)
    assert handler.calls >= 2
    assert elapsed < 2.0
    message = str(info.value)
    assert "502" in message and "bad gateway upstream" in message
    assert f"failed {handler.calls} times" in message


def test_retries_go_on_until_the_deadline_not_just_before_it() -> None:
    """A backoff longer than the time left is cut short for one last attempt at the deadline."""
    handler = Recorder(httpx.ConnectError("refused"))
    client = make_client(handler, backoff_s=10.0, max_backoff_s=10.0, retry_deadline_s=0.3)
    start = time.monotonic()
    with pytest.raises(MasterUnavailable):
        client.healthz()
    assert time.monotonic() - start >= 0.3
    assert handler.calls >= 2
    assert client.retries == handler.calls - 1


def test_zero_deadline_means_a_single_attempt() -> None:
    handler = Recorder(httpx.Response(500))
    with pytest.raises(MasterUnavailable):
        make_client(handler, retry_deadline_s=0.0).status()
    assert handler.calls == 1


def test_connection_errors_are_retried() -> None:
    handler = Recorder(
        httpx.ConnectError("connection refused"),
        httpx.ReadTimeout("timed out"),
        ok_health(),
    )
    assert make_client(handler).healthz() is True
    assert handler.calls == 3


def test_connection_errors_until_deadline_raise_unavailable() -> None:
    handler = Recorder(httpx.ConnectError("connection refused"))
    with pytest.raises(MasterUnavailable, match="ConnectError") as info:
        make_client(handler, retry_deadline_s=0.05).healthz()
    assert "connection refused" in str(info.value)
    assert handler.calls >= 2


@pytest.mark.parametrize("status", [400, 404, 422])
def test_4xx_is_not_retried(status: int) -> None:
    handler = Recorder(httpx.Response(status, json={"detail": "lr: must be > 0"}), ok_health())
    with pytest.raises(MasterRejected) as info:
        make_client(handler).train(lr=0)
    assert handler.calls == 1
    err = info.value
    assert type(err) is MasterRejected
    assert err.status_code == status
    assert err.detail == "lr: must be > 0"
    assert err.stop is False
    assert str(status) in str(err)


def test_non_json_error_body_is_kept_as_detail() -> None:
    handler = Recorder(httpx.Response(400, text="plain words"))
    with pytest.raises(MasterRejected) as info:
        make_client(handler).status()
    assert info.value.detail == "plain words"


@pytest.mark.parametrize("status", [401, 403])
def test_unauthorized(status: int) -> None:
    handler = Recorder(httpx.Response(status, json={"detail": "bad token"}))
    with pytest.raises(Unauthorized) as info:
        make_client(handler).status()
    assert isinstance(info.value, MasterRejected)
    assert info.value.status_code == status
    assert handler.calls == 1


def test_conflict_with_stop_header() -> None:
    handler = Recorder(
        httpx.Response(409, json={"detail": "run finished"}, headers={"X-A3C-Stop": "1"})
    )
    with pytest.raises(Conflict) as info:
        make_client(handler).heartbeat("w1")
    assert info.value.stop is True
    assert info.value.detail == "run finished"
    assert handler.calls == 1


def test_conflict_without_stop_header() -> None:
    handler = Recorder(httpx.Response(409, json={"detail": "stale gradients"}))
    with pytest.raises(Conflict) as info:
        make_client(handler).push_gradients("w1", 3, TENSORS, LAYOUT)
    assert info.value.stop is False


# -- stopping while the master is away -----------------------------------------------------------


def test_a_stop_event_ends_the_retry_wait_at_once() -> None:
    """A worker told to stop (its /stop, SIGTERM) must not wait out A3C_MASTER_RETRY_S first."""
    stop = threading.Event()

    def refuse_then_stop(request: httpx.Request) -> httpx.Response:
        stop.set()  # the stop arrives while the client waits to retry
        raise httpx.ConnectError("connection refused")

    handler = Recorder(refuse_then_stop)
    client = make_client(
        handler, backoff_s=30.0, max_backoff_s=30.0, retry_deadline_s=60.0, stop=stop
    )
    started = time.monotonic()
    with pytest.raises(Stopped) as info:
        client.heartbeat("w1")
    assert time.monotonic() - started < 5.0
    assert isinstance(info.value, A3CError) and not isinstance(info.value, MasterUnavailable)
    assert "stop" in str(info.value) and "/heartbeat" in str(info.value)
    assert handler.calls == 1


def test_a_stop_event_set_from_another_thread_wakes_the_wait() -> None:
    stop = threading.Event()
    handler = Recorder(httpx.Response(503, json={"detail": "restarting"}))
    client = make_client(
        handler, backoff_s=30.0, max_backoff_s=30.0, retry_deadline_s=60.0, stop=stop
    )
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            client.status()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 10
    while handler.calls < 1:  # the first attempt failed; the client is waiting to retry
        assert time.monotonic() < deadline, "the client never made its first attempt"
        time.sleep(0.005)  # polling interval, not synchronisation
    started = time.monotonic()
    stop.set()
    thread.join(10)
    assert not thread.is_alive(), "the client still waits after the stop"
    assert time.monotonic() - started < 5.0
    assert len(outcome) == 1 and isinstance(outcome[0], Stopped), outcome


def test_the_stop_event_leaves_the_stop_call_alone() -> None:
    """`stop=` (the worker's event) and `stop()` (POST /stop, for scripts) are different things."""
    handler = Recorder(httpx.Response(200, json={"data": {"stopped": True}}))
    client = make_client(handler, stop=threading.Event())
    assert client.stop() == {"data": {"stopped": True}}
    assert [(r.method, r.url.path) for r in handler.requests] == [("POST", "/stop")]


def test_without_a_stop_the_client_retries_as_before() -> None:
    stop = threading.Event()
    handler = Recorder(httpx.ConnectError("refused"), httpx.Response(503), ok_health())
    assert make_client(handler, stop=stop).healthz() is True
    assert handler.calls == 3


# -- a master that misbehaves: each attempt's bounds -----------------------------------------------


def bounded(url: str, **kwargs) -> MasterClient:
    """A client with its real transport (the bounds are the transport's)."""
    options = {"backoff_s": 0.01, "max_backoff_s": 0.02, "retry_deadline_s": 0.0} | kwargs
    return MasterClient(url, **options)


def test_an_attempt_ends_at_its_deadline_however_slowly_the_reply_trickles() -> None:
    """A byte every 0.1 s never trips httpx's per-read timeout: the attempt's own deadline ends
    it, and it is retried as any timeout."""
    with BadPeer("trickle", interval_s=0.1) as master, bounded(
        master.url, timeout_s=0.4, retry_deadline_s=0.6
    ) as client:
        started = time.monotonic()
        with pytest.raises(MasterUnavailable, match="no complete reply within 0.4 s") as info:
            client.status()
        elapsed = time.monotonic() - started
    assert "failed 2 times" in str(info.value) and len(master.heads) == 2
    assert master.sent >= 2  # bytes came all along, each before a read could time out
    assert elapsed < 2 * 0.4 + 1.0, elapsed  # two deadlines and a margin, not 64 bytes' 6.4 s


def test_a_reply_past_the_size_bound_fails_the_push_at_once_unread() -> None:
    with BadPeer("huge", length=64 << 20) as master:
        client = bounded(master.url, max_reply_bytes=4096, retry_deadline_s=30.0)
        with client, pytest.raises(ProtocolError) as info:
            client.push_gradients("w1", 3, TENSORS, LAYOUT)
    assert "reply to POST /gradients passed A3C_MAX_BODY_BYTES=4096 bytes" in str(info.value)
    assert len(master.heads) == 1  # not retried: the same reply would come again
    # The client stopped reading after its 4 KiB: the master got no further than the socket
    # buffers let it, far from its 64 MiB.
    assert master.sent < 16 << 20, master.sent


def test_a_reply_that_announces_more_than_the_bound_is_refused_before_its_body() -> None:
    with BadPeer("huge", length=64 << 20, announce=True) as master:
        client = bounded(master.url, max_reply_bytes=4096)
        with client, pytest.raises(ProtocolError, match="announces 67108864 bytes, which passes"):
            client.status()
    assert master.sent < 16 << 20, master.sent


def test_a_compressed_reply_is_refused_and_none_is_asked_for() -> None:
    """A compressed body's size once decoded is not what the bound counted."""
    with BadPeer("json", extra_headers=b"Content-Encoding: gzip\r\n") as master, bounded(
        master.url
    ) as client:
        with pytest.raises(ProtocolError, match=r"compressed \(Content-Encoding: gzip\)"):
            client.status()
        with pytest.raises(ProtocolError, match="compressed"):
            client.push_gradients("w1", 3, TENSORS, LAYOUT)
    assert all(b"\r\naccept-encoding: identity" in head.lower() for head in master.heads)


def test_a_stop_from_another_thread_ends_a_call_whose_reply_trickles() -> None:
    stop = threading.Event()
    outcome: list[BaseException] = []
    with BadPeer("trickle", interval_s=0.1) as master, bounded(
        master.url, timeout_s=30.0, retry_deadline_s=60.0, stop=stop
    ) as client:

        def call() -> None:
            try:
                client.heartbeat("w1")
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                outcome.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        wait_for(lambda: master.sent >= 1, 10, "the reply to begin trickling", interval_s=0.01)
        started = time.monotonic()
        stop.set()
        thread.join(5)
        elapsed = time.monotonic() - started
    assert not thread.is_alive(), "the call still waits after the stop"
    assert elapsed < 1.0, elapsed
    assert len(outcome) == 1 and isinstance(outcome[0], Stopped), outcome
    assert "told to stop while waiting for the reply: POST /heartbeat" in str(outcome[0])


def test_after_the_stop_no_call_is_sent_but_the_workers_last_words() -> None:
    """A call made once the worker was told to stop is not sent (a push after its last rollout
    would hold it for a whole attempt), but POST /worker_done is."""
    stop = threading.Event()
    stop.set()
    with BadPeer("json") as master, bounded(master.url, stop=stop) as client:
        with pytest.raises(Stopped, match="before the request was sent: POST /heartbeat"):
            client.heartbeat("w1")
        with pytest.raises(Stopped, match="POST /gradients"):
            client.push_gradients("w1", 3, TENSORS, LAYOUT)
        assert client.worker_done("w1") == {}
    assert [head.split(b" ")[:2] for head in master.heads] == [[b"POST", b"/worker_done"]]


# -- proxies ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("from_env", "no_proxy", "via_proxy"),
    [(False, None, False), (True, None, True), (True, "localhost,127.0.0.1", False)],
)
def test_the_environments_proxy_is_taken_only_when_asked_and_not_for_no_proxy(
    monkeypatch: pytest.MonkeyPatch, from_env: bool, no_proxy: str | None, via_proxy: bool
) -> None:
    without_proxies(monkeypatch)
    with BadPeer("json") as proxy, BadPeer("json") as master:
        monkeypatch.setenv("http_proxy", proxy.url)
        if no_proxy:
            monkeypatch.setenv("NO_PROXY", no_proxy)
        with bounded(master.url, token="t0k", proxy_from_env=from_env) as client:
            client.status()  # through httpx.Client
            client.transport.request(  # and the gradient pushes' own path
                "POST", "/gradients", {"content": b"x", "headers": {}, "timeout": 5.0}, False
            )
    reached, other = (proxy, master) if via_proxy else (master, proxy)
    assert len(reached.heads) == 2 and other.heads == []
    lines = [head.split(b"\r\n", 1)[0] for head in reached.heads]
    target = master.url.encode() if via_proxy else b""  # a proxy is sent the absolute URL
    assert lines == [b"GET %s/status HTTP/1.1" % target, b"POST %s/gradients HTTP/1.1" % target]
