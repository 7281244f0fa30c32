"""MasterClient against httpx.MockTransport: retries, the error hierarchy, headers, tensors."""

from __future__ import annotations

import ast
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch

from a3c_http import protocol, wire
from a3c_http.client import (
    A3CError,
    Conflict,
    MasterClient,
    MasterRejected,
    MasterUnavailable,
    ProtocolError,
    Stopped,
    Unauthorized,
)

BASE = "http://master.test:33333"
SPEC = {"w": (2, 2), "b": (2,)}
LAYOUT = wire.Layout(list(SPEC.items()), n_params=6)
TENSORS = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.5, -0.5])}

Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A MockTransport handler that replays `responses` in order (the last one repeats) and keeps
    every request. A response may be an exception instance, which is raised instead."""

    def __init__(self, *responses: httpx.Response | Exception | Handler) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        item = self.responses[min(len(self.requests), len(self.responses)) - 1]
        if isinstance(item, Exception):
            raise item
        if callable(item) and not isinstance(item, httpx.Response):
            return item(request)
        return item

    @property
    def calls(self) -> int:
        return len(self.requests)


def make_client(handler: Recorder, **kwargs) -> MasterClient:
    options = {"backoff_s": 0.001, "max_backoff_s": 0.002, "retry_deadline_s": 5.0} | kwargs
    return MasterClient(BASE, transport=httpx.MockTransport(handler), **options)


def ok_health() -> httpx.Response:
    return httpx.Response(200, json={"status": "ok"})


def weights_response(version: int, stop: bool = False) -> httpx.Response:
    headers = {wire.VERSION_HEADER: str(version), "Content-Type": wire.CONTENT_TYPE}
    if stop:
        headers["X-A3C-Stop"] = "1"
    return httpx.Response(200, content=wire.encode(TENSORS), headers=headers)


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


# -- headers and bodies ---------------------------------------------------------------------------


def test_authorization_header_sent_with_token() -> None:
    handler = Recorder(ok_health())
    make_client(handler, token="s3cret").healthz()
    assert handler.requests[0].headers["Authorization"] == "Bearer s3cret"


def test_no_authorization_header_without_token() -> None:
    handler = Recorder(ok_health())
    make_client(handler).healthz()
    assert "Authorization" not in handler.requests[0].headers


def test_base_url_trailing_slash() -> None:
    handler = Recorder(ok_health())
    MasterClient(BASE + "/", transport=httpx.MockTransport(handler)).healthz()
    assert str(handler.requests[0].url) == BASE + "/healthz"


def test_get_weights_not_modified_returns_none() -> None:
    handler = Recorder(httpx.Response(304))
    assert make_client(handler).get_weights(LAYOUT, if_not_version=7) is None
    (request,) = handler.requests
    assert request.method == "GET" and request.url.path == "/global_model_weights"
    assert request.headers["If-None-Match"] == '"7"'


def test_get_weights_decodes_body_and_version() -> None:
    handler = Recorder(weights_response(8))
    got = make_client(handler).get_weights(LAYOUT)
    assert "If-None-Match" not in handler.requests[0].headers
    assert got is not None
    assert got.version == 8 and got.stop is False
    for name, t in TENSORS.items():
        assert torch.equal(got.tensors[name], t)


def test_get_weights_that_do_not_fit_raise_protocol_error_without_retry() -> None:
    handler = Recorder(weights_response(8))
    with pytest.raises(ProtocolError, match="missing") as info:
        make_client(handler).get_weights(wire.Layout([*SPEC.items(), ("extra", (1,))], 7))
    assert isinstance(info.value.__cause__, wire.WireError)
    assert isinstance(info.value, A3CError)
    assert handler.calls == 1


def test_a_weights_reply_without_a_version_is_a_protocol_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=wire.encode(TENSORS))

    with pytest.raises(ProtocolError, match="X-Model-Version"):
        make_client(handler).get_weights(LAYOUT)


def test_push_gradients_headers_body_and_reply() -> None:
    grads = {"w": torch.full((2, 2), 0.25), "b": torch.tensor([1.0, -1.0])}
    handler = Recorder(weights_response(13, stop=True))
    client = make_client(handler, token="t", run_id="run-42")
    reply = client.push_gradients("w7", 12, grads, LAYOUT)
    (request,) = handler.requests
    assert request.method == "POST" and request.url.path == "/gradients"
    assert request.headers["X-Worker-Id"] == "w7"
    assert request.headers["X-Model-Version"] == "12"
    assert request.headers["X-Run-Id"] == "run-42"
    assert request.headers["Content-Type"] == "application/octet-stream"
    assert request.headers["Authorization"] == "Bearer t"
    sent = wire.decode(request.content, SPEC)
    for name, g in grads.items():
        assert torch.equal(sent[name], g)
    assert reply.version == 13
    assert reply.stop is True
    assert torch.equal(reply.tensors["w"], TENSORS["w"])


def test_push_gradients_without_run_id_sends_no_run_header() -> None:
    handler = Recorder(weights_response(1))
    make_client(handler).push_gradients("w1", 0, TENSORS, LAYOUT)
    assert "X-Run-Id" not in handler.requests[0].headers


def test_push_gradients_retried_on_5xx_resends_the_same_body() -> None:
    handler = Recorder(httpx.Response(503), weights_response(2))
    make_client(handler).push_gradients("w1", 1, TENSORS, LAYOUT)
    assert handler.calls == 2
    assert handler.requests[0].content == handler.requests[1].content
    assert handler.requests[1].content


def test_push_weights_query_and_body() -> None:
    handler = Recorder(httpx.Response(200, json={"data": {"model_version": 3}}))
    make_client(handler).push_weights("w2", TENSORS, temporary=True)
    (request,) = handler.requests
    assert request.url.path == "/local_model_weights"
    assert request.url.params["worker_id"] == "w2"
    assert request.url.params["temporary"] == "true"
    assert set(wire.decode(request.content, SPEC)) == set(SPEC)


def test_json_calls_carry_run_id_and_unwrap_data() -> None:
    handler = Recorder(
        httpx.Response(200, json={"data": {"global_episode": 5, "stop": False}}),
        httpx.Response(200, json={"data": {"stop": True}}),
    )
    client = make_client(handler, run_id="r1")
    assert client.episode("w1", 21.0, 21) == {"global_episode": 5, "stop": False}
    assert client.heartbeat("w1", episodes=3) is True
    episode_body = json.loads(handler.requests[0].content)
    assert episode_body == {"worker_id": "w1", "reward": 21.0, "length": 21, "run_id": "r1"}
    heartbeat_body = json.loads(handler.requests[1].content)
    assert heartbeat_body == {"worker_id": "w1", "run_id": "r1", "episodes": 3}
    assert [r.method for r in handler.requests] == ["POST", "POST"]


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


# -- the contract's names ------------------------------------------------------------------------


def test_the_services_take_the_contracts_names_from_one_module() -> None:
    """master/ and worker/ never import a3c_http.client for header names; the client and the
    services share a3c_http.protocol."""
    root = Path(__file__).resolve().parent.parent
    offenders = []
    for folder in ("master", "worker"):
        for path in sorted((root / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "a3c_http.client":
                    constants = [a.name for a in node.names if a.name.isupper()]
                    if constants:
                        offenders.append(f"{path.name}: {constants}")
    assert offenders == [], offenders
    assert (protocol.VERSION_HEADER, protocol.CONTENT_TYPE) == (
        wire.VERSION_HEADER,
        wire.CONTENT_TYPE,
    )
    names = {
        protocol.SEQ_HEADER,
        protocol.STOP_HEADER,
        protocol.DUPLICATE_HEADER,
        protocol.VERSION_HEADER,
        protocol.RUN_ID_HEADER,
        protocol.WORKER_ID_HEADER,
    }
    assert names == {
        "X-A3C-Seq",
        "X-A3C-Stop",
        "X-A3C-Duplicate",
        "X-Model-Version",
        "X-Run-Id",
        "X-Worker-Id",
    }
