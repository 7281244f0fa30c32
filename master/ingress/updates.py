"""The master's one update route: every push a worker makes, served straight from ASGI.

- `POST /gradients` (algo a3c, a2c, best_weights, dqn): an update computed on a worker, applied by
  the parameter server; the reply is the new weights.
- `POST /experience` (algo ppo, impala, apex): a rollout or a batch of transitions, for the learner
  beside the master; the reply is the newest weights when the worker's are older (200), else the
  version alone (204), or 503 with `Retry-After` when the learner's queue stayed full.

Both are one safetensors body with the same headers (master/api/headers.py `PushHeaders`), judged
by one model, admitted once and taken by one facade (`ClusterState.apply_update`), which asks the
run's algorithm what its workers push. A push through FastAPI's router, its dependency injection
and its request and response objects cost the master about as much as the update itself
(docs/performance.md, "The parameter server"), so `UpdateRoute` (master/ingress/route.py), an ASGI
middleware inside the gate and the body limit (a3c_http/server/service.py `install_common`: a push
still passes the token, page, content-type, size and time checks first), answers them itself and
hands them to `push` here; the receivers (master/ingress/receivers.py) run the same route and hand
what it read to `take_push` here. The
routes stay declared in master/api/weights.py, which gives them
their OpenAPI schema and serve them through FastAPI should a request ever get past this layer;
both call `push`, so they answer alike.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterable
from typing import Any

from starlette.concurrency import run_in_threadpool

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
from master.api.headers import PushHeaders
from master.api.metrics import MasterMetrics
from master.errors import Invalid, StateConflict
from master.ingress.route import Reply, json_reply
from master.learning.rounds import Outcome, await_outcome, outcome_reply
from master.state import ClusterState, LearnerBusy, Sends, WouldWait

# The route of each kind of push, and the kind of each route.
KINDS = {"/gradients": Sends.GRADIENTS, "/experience": Sends.EXPERIENCE}
# A body up to this size is taken on the event loop itself: the hop to a threadpool thread and
# back, and the GIL passed between them, cost more than the loop's pause (about 0.6 ms of a 1M
# gradient push, docs/performance.md "The parameter server"). 8 MiB takes models of up to two
# million parameters inline, with a pause of a few milliseconds for other requests; larger ones
# go to the threadpool, as does an experience push that would wait for the learner.
INLINE_BYTES = 8 << 20

def take_push(
    state: ClusterState, metrics: MasterMetrics, path: str, headers: PushHeaders, body: bytes
) -> Reply | Awaitable[Reply]:
    """One push to `path` (a key of KINDS): its status, headers and body (the new weights, or
    the error's JSON), at once where the master waits for nothing (a body of up to INLINE_BYTES:
    a gradient push in async mode, a rollout with room in the learner's queue), else an
    awaitable of them (a larger body, applied off the loop; a sync round, answered when it
    closes; a rollout that waits for room in the learner's queue, or for its update). A caller
    that takes the answer at once saves the task a coroutine would need (the receivers' channel,
    master/ingress/receivers.py)."""
    started = time.perf_counter()
    kind = KINDS[path]
    if len(body) > INLINE_BYTES:
        return _offloaded(state, metrics, kind, headers, body, started)
    try:
        outcome, run_summary = state.apply_update(kind, *_arguments(headers, body), wait=False)
        if not outcome.is_done():
            return _awaited_reply(state, metrics, kind, outcome, run_summary, started)
        return _success(metrics, kind, started, outcome_reply(outcome), run_summary)
    except _REFUSALS as exc:
        return _refusal(exc)
    except WouldWait:  # nothing was taken: again, where it may wait for the learner
        return _offloaded(state, metrics, kind, headers, body, started)


async def push(
    state: ClusterState, metrics: MasterMetrics, path: str, headers: PushHeaders, body: bytes
) -> Reply:
    """`take_push`'s answer, awaited where it must be."""
    reply = take_push(state, metrics, path, headers, body)
    return reply if isinstance(reply, tuple) else await reply


# What the master refuses a push for: 409 (StateConflict), 422 or 503 (LearnerBusy); the global
# state is untouched.
_REFUSALS = (StateConflict, WireError, Invalid, LearnerBusy)


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
    state: ClusterState,
    metrics: MasterMetrics,
    kind: Sends,
    headers: PushHeaders,
    body: bytes,
    started: float,
) -> Reply:
    try:
        outcome, run_summary = await run_in_threadpool(
            state.apply_update, kind, *_arguments(headers, body)
        )
    except _REFUSALS as exc:
        return _refusal(exc)
    return await _awaited_reply(state, metrics, kind, outcome, run_summary, started)


async def _awaited_reply(
    state: ClusterState,
    metrics: MasterMetrics,
    kind: Sends,
    outcome: Outcome,
    run_summary: dict[str, Any],
    started: float,
) -> Reply:
    try:
        answer = await await_outcome(outcome, state.params.close_round)
    except _REFUSALS as exc:
        return _refusal(exc)
    return _success(metrics, kind, started, answer, run_summary)


def _success(
    metrics: MasterMetrics,
    kind: Sends,
    started: float,
    answer: tuple[bytes | None, int, bool],
    run_summary: dict[str, Any],
) -> Reply:
    """200 with the weights, or 204 (an experience push from a worker whose weights are the
    newest: `weights` None), with the version and the run's summary."""
    weights, version, duplicate = answer
    reply_headers = [(VERSION_HEADER, str(version)), *summary_headers(run_summary)]
    if duplicate:
        reply_headers.append((DUPLICATE_HEADER, "1"))
    if kind is Sends.GRADIENTS:
        metrics.push_seconds.observe(time.perf_counter() - started)
    if weights is None:
        return 204, reply_headers, b""
    return 200, [("content-type", CONTENT_TYPE), ("etag", f'"{version}"'), *reply_headers], weights


def _refusal(exc: Exception) -> Reply:
    if isinstance(exc, StateConflict):
        return json_reply(409, {"detail": str(exc)}, [(STOP_HEADER, "1")] if exc.stop else [])
    if isinstance(exc, LearnerBusy):
        return json_reply(503, {"detail": str(exc)}, [("retry-after", "1")])
    return json_reply(422, {"detail": str(exc)})


def summary_headers(run_summary: dict[str, Any]) -> Iterable[tuple[str, str]]:
    """The run's summary on a push's reply, as POST /episode answers them."""
    yield GLOBAL_EPISODE_HEADER, str(run_summary["global_episode"])
    yield IMPROVED_HEADER, "1" if run_summary["improved"] else "0"
    yield STOP_HEADER, "1" if run_summary["stop"] else "0"
    for name, value in (
        (BEST_SCORE_HEADER, run_summary["best_score"]),
        (MOVING_AVERAGE_HEADER, run_summary["moving_average"]),
    ):
        if value is not None:
            yield name, repr(float(value))
