"""Tensors over HTTP: the global weights, workers' weights and gradients (safetensors bodies).

POST /gradients is async so that, in sync mode, a request waiting for its round holds no thread
(master/rounds.py); decoding, screening and optimizer steps run in the threadpool."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Header, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from a3c_http.protocol import (
    BEST_SCORE_HEADER,
    CONTENT_TYPE,
    DUPLICATE_HEADER,
    GLOBAL_EPISODE_HEADER,
    IMPROVED_HEADER,
    MOVING_AVERAGE_HEADER,
    RUN_ID_HEADER,
    STOP_HEADER,
    VERSION_HEADER,
    WORKER_ID_HEADER,
)
from a3c_http.service import BINARY_BODY, INVALID, conflict, protected_router
from master.deps import State
from master.rounds import settle
from master.schemas import ReportedLoss, ReportedNorm, Seq, WorkerId

router = protected_router(tags=["weights"])
# The routes that take a safetensors body (the rest take JSON, or nothing).
TENSOR_PATHS = frozenset({"/local_model_weights", "/gradients"})
# A gradient body up to this size is applied on the event loop itself: for such a model the
# update (decode, one optimizer step) takes less time than the hop to a threadpool thread and back,
# and pushes waiting in threads would only contend for the GIL and the parameter server's lock.
# Larger ones go to the threadpool, so that the loop keeps serving other requests meanwhile.
INLINE_BYTES = 1 << 20
RunId = Annotated[str | None, Header(alias=RUN_ID_HEADER, max_length=64)]

_TENSOR_BODY = {
    "content": {CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
    "description": "one safetensors file, a float32 tensor per parameter of state_dict()",
}


def _weights_response(body: bytes, version: int, duplicate: bool = False) -> Response:
    headers = {VERSION_HEADER: str(version), "ETag": f'"{version}"'}
    if duplicate:
        headers[DUPLICATE_HEADER] = "1"
    return Response(body, media_type=CONTENT_TYPE, headers=headers)


@router.get(
    "/global_model_weights",
    response_class=Response,
    responses={
        200: _TENSOR_BODY,
        304: {"description": "unchanged since If-None-Match"},
        **INVALID,
        **conflict("no run has started: POST /train first"),
    },
)
def global_model_weights(
    state: State, if_none_match: Annotated[str | None, Header()] = None
) -> Response:
    body, version = state.params.weights()
    if if_none_match is not None:
        tags = {t.strip().removeprefix("W/").strip('"') for t in if_none_match.split(",")}
        if str(version) in tags or "*" in tags:
            return Response(
                status_code=304, headers={"ETag": f'"{version}"', VERSION_HEADER: str(version)}
            )
    return _weights_response(body, version)


@router.post(
    "/local_model_weights",
    responses={
        **BINARY_BODY,
        **conflict(
            "no run is running, `X-Run-Id` names an earlier run, or `worker_id` is not "
            "registered in the run"
        ),
    },
    openapi_extra={"requestBody": {"required": True, **_TENSOR_BODY}},
)
async def local_model_weights(
    request: Request,
    state: State,
    worker_id: Annotated[WorkerId, Query()],
    temporary: Annotated[bool, Query()] = False,
    x_run_id: RunId = None,
    x_a3c_seq: Seq = None,
) -> dict:
    body = await request.body()
    version, duplicate = await run_in_threadpool(
        state.put_weights, worker_id, body, temporary, x_run_id, x_a3c_seq
    )
    return {"data": {"model_version": version, "temporary": temporary, "duplicate": duplicate}}


@router.post(
    "/gradients",
    response_class=Response,
    responses={
        200: _TENSOR_BODY,
        **BINARY_BODY,
        **conflict(
            "no run is running, `X-Run-Id` names another run, `X-Worker-Id` is not registered "
            "in the run, the gradients are more than `max_staleness` versions old (in sync "
            "mode: not of the current version, or a second push of the worker in the round), "
            "or their norm or loss is an outlier "
            "(`outlier_sigma`), or the step would have made the weights or the optimizer's state "
            "non-finite (undone); nothing applied"
        ),
    },
    openapi_extra={"requestBody": {"required": True, **_TENSOR_BODY}},
)
async def gradients(
    request: Request,
    state: State,
    x_worker_id: Annotated[WorkerId, Header(alias=WORKER_ID_HEADER)],
    x_model_version: Annotated[int, Header(alias=VERSION_HEADER, ge=0)],
    x_run_id: RunId = None,
    x_a3c_seq: Seq = None,
    x_a3c_loss: ReportedLoss = None,
    x_a3c_grad_norm: ReportedNorm = None,
) -> Response:
    started = time.perf_counter()
    body = await request.body()
    args = (x_worker_id, x_model_version, body, x_run_id, x_a3c_seq, x_a3c_loss, x_a3c_grad_norm)
    if len(body) <= INLINE_BYTES:
        outcome, figures = state.apply_gradients(*args)
    else:
        outcome, figures = await run_in_threadpool(state.apply_gradients, *args)
    weights, version, duplicate = await settle(outcome, state.params.close_round)
    response = _weights_response(weights, version, duplicate)
    response.headers.update(figure_headers(figures))
    request.app.state.metrics.push_seconds.observe(time.perf_counter() - started)
    return response


def figure_headers(figures: dict) -> dict[str, str]:
    """The run's figures on a gradient push's reply, as POST /episode answers them."""
    headers = {
        GLOBAL_EPISODE_HEADER: str(figures["global_episode"]),
        IMPROVED_HEADER: "1" if figures["improved"] else "0",
        STOP_HEADER: "1" if figures["stop"] else "0",
    }
    for name, value in (
        (BEST_SCORE_HEADER, figures["best_score"]),
        (MOVING_AVERAGE_HEADER, figures["moving_average"]),
    ):
        if value is not None:
            headers[name] = repr(float(value))
    return headers
