"""Tensors over HTTP: the global weights, workers' weights, gradients and experience (safetensors
bodies).

The pushes of the workers' hot path, POST /gradients and POST /experience, are served by
master/ingress/updates.py and declared here; they are async so that a push waiting for its sync
round (master/learning/rounds.py) or for a place in the learner's queue holds no thread of the
event loop."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from a3c_http.server.service import BINARY_BODY, INVALID, conflict, error, protected_router
from a3c_http.wire.protocol import (
    CONTENT_TYPE,
    DUPLICATE_HEADER,
    RUN_ID_HEADER,
    VERSION_HEADER,
)
from master.api.deps import State
from master.api.headers import PushHeaders, Seq, WorkerId
from master.ingress.updates import push

router = protected_router(tags=["weights"])
RunId = Annotated[str | None, Header(alias=RUN_ID_HEADER, max_length=64)]

_TENSOR_BODY = {
    "content": {CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
    "description": "one safetensors file, a tensor per entry of state_dict(): the parameters "
    "in the run's wire_dtype (float32 or bfloat16), the running statistics in float32",
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
    return _tagged(*state.params.weights(), if_none_match)


def _tagged(body: bytes, version: int, if_none_match: str | None) -> Response:
    """A weights body of `version`, or 304 when If-None-Match names that version."""
    if if_none_match is not None:
        tags = {t.strip().removeprefix("W/").strip('"') for t in if_none_match.split(",")}
        if str(version) in tags or "*" in tags:
            return Response(
                status_code=304, headers={"ETag": f'"{version}"', VERSION_HEADER: str(version)}
            )
    return _weights_response(body, version)


@router.get(
    "/target_model_weights",
    response_class=Response,
    responses={
        200: _TENSOR_BODY,
        304: {"description": "unchanged since If-None-Match"},
        **INVALID,
        **conflict("no run has started, or the run keeps no target network (algo dqn, apex)"),
    },
)
def target_model_weights(
    state: State, if_none_match: Annotated[str | None, Header()] = None
) -> Response:
    """The target network of a value-based run (algo dqn and apex), `X-Model-Version` its
    version: the global weights of that version (master/learning/target.py)."""
    return _tagged(*state.params.target_weights(), if_none_match)


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
    request: Request, state: State, headers: Annotated[PushHeaders, Header()]
) -> Response:
    """Served by master/ingress/updates.py `UpdateRoute` before FastAPI routes it; declared here
    for its schema, and answered here alike should a request get past that layer."""
    status, reply_headers, content = await push(
        state, request.app.state.metrics, "/gradients", headers, await request.body()
    )
    return Response(content, status_code=status, headers=dict(reply_headers))


_ROLLOUT_BODY = {
    "content": {CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
    "description": "one safetensors file of the rollout's tensors, [t_max, num_envs] each "
    "(observations with their own trailing dimensions): obs, actions, log_probs, rewards, "
    "terminated, truncated, valid, starts, last_obs [num_envs, ...], last_start [num_envs], "
    "state.0 and state.1 for an lstm core, the running statistics' batch moments",
}


@router.post(
    "/experience",
    tags=["experience"],
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
            "description": "the newest weights, newer than X-Model-Version",
        },
        204: {"description": "taken; the worker's weights are the newest"},
        **BINARY_BODY,
        **conflict(
            "no run is running, `X-Run-Id` names another run, `X-Worker-Id` is not registered "
            "in the run, or the run's workers push gradients (POST /gradients); nothing taken"
        ),
        503: error("the learner's queue stayed full, or the learner is not running: retry"),
    },
    openapi_extra={"requestBody": {"required": True, **_ROLLOUT_BODY}},
)
async def experience(
    request: Request, state: State, headers: Annotated[PushHeaders, Header()]
) -> Response:
    """A rollout for the learner beside the master (algo ppo, impala and apex): its body one
    safetensors file of the rollout's tensors (a3c_http/algos/learner.py `rollout_tensors`), its
    metadata the rollout's report as a gradient push's, its headers a gradient push's, with
    `X-Model-Version` the version of the weights that acted. Checked whole before anything is
    counted. Served by `UpdateRoute` as `POST /gradients` is, and through the receivers alike."""
    status, reply_headers, content = await push(
        state, request.app.state.metrics, "/experience", headers, await request.body()
    )
    return Response(content, status_code=status, headers=dict(reply_headers))
