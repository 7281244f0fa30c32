"""MasterClient's messages against httpx.MockTransport: the headers and bodies of each call, the
weights and gradients on the wire, and the contract's names shared with the services."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import httpx
import pytest
import torch

from a3c_http.net.client import A3CError, MasterClient, ProtocolError
from a3c_http.wire import protocol
from a3c_http.wire import tensors as wire
from tests.support.client import (
    BASE,
    LAYOUT,
    SPEC,
    TENSORS,
    Recorder,
    make_client,
    ok_health,
    weights_response,
)

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


# -- the contract's names ------------------------------------------------------------------------


def test_the_services_take_the_contracts_names_from_one_module() -> None:
    """master/ and worker/ never import a3c_http.net.client for header names; the client and the
    services share a3c_http.wire.protocol."""
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for folder in ("master", "worker"):
        for path in sorted((root / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "a3c_http.net.client":
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
