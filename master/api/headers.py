"""The headers of the workers' pushes as the master's routes and its receivers read them (the
worker's id, its request number, the version and the figures of a gradient push), and the paths
whose bodies are tensors. Torch-free, as a receiver is (master/ingress/receiver.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header
from pydantic import BaseModel, ConfigDict, Field

from a3c_http.wire.protocol import (
    GRAD_NORM_HEADER,
    LOSS_HEADER,
    MAX_SEQ,
    RUN_ID_HEADER,
    SEQ_HEADER,
    VERSION_HEADER,
    WORKER_ID_HEADER,
    WORKER_ID_PATTERN,
)

# The routes that take a safetensors body (the rest take JSON, or nothing).
TENSOR_PATHS = frozenset({"/local_model_weights", "/gradients", "/experience"})
WorkerId = Annotated[str, Field(min_length=1, max_length=128, pattern=WORKER_ID_PATTERN)]
# X-A3C-Seq: a worker's own rising number for its episode reports, gradients and weights; a retry
# keeps the number of its first attempt, so the master never counts it twice.
# Optional (the routes default it to None), but never null: the schema says integer.
_SEQ = {"alias": SEQ_HEADER, "ge": 1, "le": MAX_SEQ,
        "description": "The worker's rising request number; retries keep it."}
Seq = Annotated[int, Header(**_SEQ)]


class PushHeaders(BaseModel):
    """The headers of a push (`POST /gradients`, `POST /experience`), one model for the routes'
    schema (master/api/weights.py) and for the ASGI route that serves them
    (master/ingress/route.py), so both judge a push alike."""

    model_config = ConfigDict(extra="ignore")  # the request's other headers
    worker_id: Annotated[WorkerId, Field(alias=WORKER_ID_HEADER)]
    model_version: Annotated[
        int, Field(alias=VERSION_HEADER, ge=0, description="The version they were computed on.")
    ]
    run_id: Annotated[str, Field(alias=RUN_ID_HEADER, max_length=64)] = None
    seq: Annotated[int, Field(**_SEQ)] = None
    loss: Annotated[
        float,
        Field(
            alias=LOSS_HEADER,
            allow_inf_nan=False,
            description="The total loss of the rollout the gradients come from.",
        ),
    ] = None
    grad_norm: Annotated[
        float,
        Field(
            alias=GRAD_NORM_HEADER,
            ge=0,
            allow_inf_nan=False,
            description="The global L2 norm of the gradients before clipping.",
        ),
    ] = None
