"""`POST /experience`: a worker's rollout for the learner beside the master (`algo` ppo, impala
and apex; master/learning/learner_process.py).

The body is one safetensors file of the rollout's tensors (a3c_http/algos/learner.py
`rollout_tensors`, docs/http-api.md), its metadata the rollout's report as a gradient push's. The
headers are a gradient push's (master/api/schemas.py `PushHeaders`): `X-Model-Version` is the
version of the weights that acted. The master checks it all before anything is counted
(`ClusterState.apply_experience`) and answers with the newest weights when the worker's are older
(200), or with the version and the run's summary alone (204); 503 with `Retry-After` when the
learner's queue stayed full for `hold_s` (the worker's transport retries it, with the same
`X-A3C-Seq`). Receivers (A3C_RECEIVERS) carry gradient pushes only: experience goes to the
master's own port.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from a3c_http.server.service import BINARY_BODY, conflict, error, protected_router
from a3c_http.wire.protocol import CONTENT_TYPE, DUPLICATE_HEADER, VERSION_HEADER
from master.api.deps import State
from master.api.schemas import PushHeaders
from master.ingress.gradients import summary_headers
from master.state import LearnerBusy

PATH = "/experience"
router = protected_router(tags=["experience"])

_ROLLOUT_BODY = {
    "content": {CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
    "description": "one safetensors file of the rollout's tensors, [t_max, num_envs] each "
    "(observations with their own trailing dimensions): obs, actions, log_probs, rewards, "
    "terminated, truncated, valid, starts, last_obs [num_envs, ...], last_start [num_envs], "
    "state.0 and state.1 for an lstm core, the running statistics' batch moments",
}


@router.post(
    PATH,
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
            "in the run, or the run's workers push gradients (algo a3c); nothing taken"
        ),
        503: error("the learner's queue stayed full, or the learner is not running: retry"),
    },
    openapi_extra={"requestBody": {"required": True, **_ROLLOUT_BODY}},
)
async def experience(
    request: Request, state: State, headers: Annotated[PushHeaders, Header()]
) -> Response:
    body = await request.body()
    try:
        answer, duplicate, run_summary = await run_in_threadpool(
            state.apply_experience,
            headers.worker_id,
            headers.model_version,
            body,
            headers.run_id,
            headers.seq,
        )
    except LearnerBusy as exc:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "1"})
    version = answer if isinstance(answer, int) else answer[1]
    reply_headers = {VERSION_HEADER: str(version), **dict(summary_headers(run_summary))}
    if duplicate:
        reply_headers[DUPLICATE_HEADER] = "1"
    if isinstance(answer, int):
        return Response(status_code=204, headers=reply_headers)
    reply_headers["ETag"] = f'"{version}"'
    return Response(answer[0], media_type=CONTENT_TYPE, headers=reply_headers)
