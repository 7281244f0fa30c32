"""`POST /gradients`, the workers' hot path, served straight from ASGI.

A push through FastAPI's router, its dependency injection and its request and response objects
cost the master about as much as the update itself (docs/performance.md, "The parameter
server"). So `GradientRoute`, an ASGI
middleware inside the gate and the body limit (a3c_http/server/service.py `install_common`: a push
still passes the token, page, content-type, size and time checks first), answers
`POST /gradients` itself. The route stays declared in master/api/weights.py, which gives it
its OpenAPI schema and serves it through FastAPI should a request ever get past this layer; both
call `push`, and judge the headers with one model (master/api/schemas.py `PushHeaders`), so they
answer alike: the same 422 body for bad headers, the same 409 and 422 for what the master
refuses, the same weights and run summary on success.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from a3c_http.server.service import validation_body
from a3c_http.wire.protocol import (
    BEST_SCORE_HEADER,
    CONTENT_TYPE,
    DUPLICATE_HEADER,
    GLOBAL_EPISODE_HEADER,
    IMPROVED_HEADER,
    MOVING_AVERAGE_HEADER,
    STOP_HEADER,
    VERSION_HEADER,
)
from a3c_http.wire.tensors import WireError
from master.api.metrics import MasterMetrics
from master.api.schemas import PushHeaders
from master.errors import Invalid, StateConflict
from master.learning.rounds import Outcome, await_outcome, outcome_reply
from master.state import ClusterState

PATH = "/gradients"
# A gradient body up to this size is applied on the event loop itself: the hop to a threadpool
# thread and back, and the GIL passed between them, cost more than the loop's pause (about 0.6 ms
# of a 1M push, docs/performance.md "The parameter server"). 8 MiB takes models of up to two
# million parameters inline, with a pause of a few milliseconds for other requests; larger ones
# go to the threadpool.
INLINE_BYTES = 8 << 20
# PushHeaders's fields by the lower-case header names ASGI gives.
_ALIASES = {field.alias.lower(): field.alias for field in PushHeaders.model_fields.values()}

Reply = tuple[int, list[tuple[str, str]], bytes]


def take_push(
    state: ClusterState, metrics: MasterMetrics, headers: PushHeaders, body: bytes
) -> Reply | Awaitable[Reply]:
    """One gradient push: its status, headers and body (the new weights, or the error's JSON),
    at once where the master waits for nothing (a body of up to INLINE_BYTES in async mode: a
    worker's every push), else an awaitable of them (a larger body, applied off the loop; a
    sync round, answered when it closes). A caller that takes the answer at once saves the task
    a coroutine would need (the receivers' channel, master/ingress/receivers.py)."""
    started = time.perf_counter()
    if len(body) > INLINE_BYTES:
        return _offloaded(state, metrics, headers, body, started)
    try:
        outcome, run_summary = state.apply_gradients(*_arguments(headers, body))
        if not outcome.is_done():
            return _awaited_reply(state, metrics, outcome, run_summary, started)
        return _success(metrics, started, outcome_reply(outcome), run_summary)
    except _REFUSALS as exc:
        return _refusal(exc)


async def push(
    state: ClusterState, metrics: MasterMetrics, headers: PushHeaders, body: bytes
) -> Reply:
    """`take_push`'s answer, awaited where it must be."""
    reply = take_push(state, metrics, headers, body)
    return reply if isinstance(reply, tuple) else await reply


# What the master refuses a push for: 409 (StateConflict) or 422; the global state is untouched.
_REFUSALS = (StateConflict, WireError, Invalid)


def _arguments(headers: PushHeaders, body: bytes) -> tuple[Any, ...]:
    return (
        headers.worker_id,
        headers.model_version,
        body,
        headers.run_id,
        headers.seq,
        headers.loss,
        headers.grad_norm,
    )


async def _offloaded(
    state: ClusterState, metrics: MasterMetrics, headers: PushHeaders, body: bytes, started: float
) -> Reply:
    try:
        outcome, run_summary = await run_in_threadpool(
            state.apply_gradients, *_arguments(headers, body)
        )
    except _REFUSALS as exc:
        return _refusal(exc)
    return await _awaited_reply(state, metrics, outcome, run_summary, started)


async def _awaited_reply(
    state: ClusterState,
    metrics: MasterMetrics,
    outcome: Outcome,
    run_summary: dict[str, Any],
    started: float,
) -> Reply:
    try:
        answer = await await_outcome(outcome, state.params.close_round)
    except _REFUSALS as exc:
        return _refusal(exc)
    return _success(metrics, started, answer, run_summary)


def _success(
    metrics: MasterMetrics,
    started: float,
    answer: tuple[bytes, int, bool],
    run_summary: dict[str, Any],
) -> Reply:
    weights, version, duplicate = answer
    reply_headers = [
        ("content-type", CONTENT_TYPE),
        (VERSION_HEADER, str(version)),
        ("etag", f'"{version}"'),
        *summary_headers(run_summary),
    ]
    if duplicate:
        reply_headers.append((DUPLICATE_HEADER, "1"))
    metrics.push_seconds.observe(time.perf_counter() - started)
    return 200, reply_headers, weights


def _refusal(exc: Exception) -> Reply:
    if isinstance(exc, StateConflict):
        return _error(409, {"detail": str(exc)}, [(STOP_HEADER, "1")] if exc.stop else [])
    return _error(422, {"detail": str(exc)})


def summary_headers(run_summary: dict[str, Any]) -> Iterable[tuple[str, str]]:
    """The run's summary on a gradient push's reply, as POST /episode answers them."""
    yield GLOBAL_EPISODE_HEADER, str(run_summary["global_episode"])
    yield IMPROVED_HEADER, "1" if run_summary["improved"] else "0"
    yield STOP_HEADER, "1" if run_summary["stop"] else "0"
    for name, value in (
        (BEST_SCORE_HEADER, run_summary["best_score"]),
        (MOVING_AVERAGE_HEADER, run_summary["moving_average"]),
    ):
        if value is not None:
            yield name, repr(float(value))


def _error(status: int, body: dict[str, Any], headers: list[tuple[str, str]] = ()) -> Reply:
    return status, [("content-type", "application/json"), *headers], json.dumps(body).encode()


Push = Callable[[PushHeaders, bytes], Awaitable[Reply]]


class GradientRoute:
    """ASGI middleware: `POST /gradients` answered here (see the module's docstring) by `push`
    (the master's own, `push` above bound to its state; a receiver's forwards it to the master,
    master/ingress/receiver.py); every other request goes on to the app."""

    def __init__(self, app: ASGIApp, push: Push) -> None:
        self.app = app
        self.push = push

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        given = {}
        for name, value in scope["headers"]:
            alias = _ALIASES.get(name.decode("latin-1"))
            if alias is not None:
                given[alias] = value.decode("latin-1")
        body = await _body(receive)
        if body is None:  # the client left before its body was in: nothing to answer
            return
        try:
            headers = PushHeaders.model_validate(given)
        except ValidationError as exc:
            errors = [{**e, "loc": ("header", *e["loc"])} for e in exc.errors()]
            reply = _error(422, validation_body(errors))
        else:
            reply = await self.push(headers, body)
        status, headers_out, content = reply
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers_out]
        raw.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": content})


async def _body(receive: Receive) -> bytes | bytearray | None:
    """The request's whole body (its size and time are bounded by the body limit outside), or
    None when the client left first. A body in several chunks is joined into a bytearray,
    which the decoder then takes as the gradient vector's memory (a3c_http/wire/tensors.py
    `Layout.decode`): one pass over a large model's body instead of two."""
    chunks: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else bytearray().join(chunks)
