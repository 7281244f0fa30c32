"""Tensors over HTTP: the global weights, workers' weights and gradients (safetensors bodies)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from a3c_http.client import DUPLICATE_HEADER
from a3c_http.wire import CONTENT_TYPE, VERSION_HEADER
from master.deps import State
from master.schemas import Seq, WorkerId

router = APIRouter(tags=["weights"])

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
    responses={200: _TENSOR_BODY, 304: {"description": "unchanged since If-None-Match"}},
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
    openapi_extra={"requestBody": {"required": True, **_TENSOR_BODY}},
)
async def local_model_weights(
    request: Request,
    state: State,
    worker_id: Annotated[WorkerId, Query()],
    temporary: Annotated[bool, Query()] = False,
    x_run_id: Annotated[str | None, Header(max_length=64)] = None,
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
    responses={200: _TENSOR_BODY},
    openapi_extra={"requestBody": {"required": True, **_TENSOR_BODY}},
)
async def gradients(
    request: Request,
    state: State,
    x_worker_id: Annotated[WorkerId, Header()],
    x_model_version: Annotated[int, Header(ge=0)],
    x_run_id: Annotated[str | None, Header(max_length=64)] = None,
    x_a3c_seq: Seq = None,
) -> Response:
    body = await request.body()
    weights, version, duplicate = await run_in_threadpool(
        state.apply_gradients, x_worker_id, x_model_version, body, x_run_id, x_a3c_seq
    )
    return _weights_response(weights, version, duplicate)
