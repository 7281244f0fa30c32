"""The run's parameter-server shards (master/shards/): where a worker stages its gradients' slices
(`GET /shards`), and a push's commit once every shard has its slice (`POST /shards/commit`)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from a3c_http.server.service import JSON_BODY, conflict, error, protected_router
from a3c_http.wire.protocol import MAX_SEQ, MAX_SQLITE_INT, SHARDS_PATH
from master.api.deps import State
from master.api.headers import WorkerId
from master.api.schemas import Finite, RunId

router = protected_router(tags=["shards"])
_DOWN = {503: error("a shard failed and the master is putting every shard back (Retry-After)")}


class Receipt(BaseModel):
    """What a shard answered when it staged its slice (master/shards/shard.py `Shard.stage`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    shard: int = Field(ge=0, le=63)
    epoch: str = Field(max_length=64)
    sumsq: Finite = Field(ge=0)
    receipt: str = Field(max_length=64)


class Commit(BaseModel):
    """A push whose gradients every shard has staged: what a gradient push's headers say, its
    rollout's report, and every shard's receipt."""

    model_config = ConfigDict(extra="forbid", strict=True)
    worker_id: WorkerId
    run_id: RunId = None
    version: int = Field(
        ge=0, le=MAX_SQLITE_INT, description="The weights' version the gradients were computed on."
    )
    seq: int = Field(ge=1, le=MAX_SEQ, description="The worker's request number (X-A3C-Seq's).")
    loss: Finite | None = None
    grad_norm: Finite | None = Field(None, ge=0, description="Their norm before clipping.")
    receipts: list[Receipt] = Field(max_length=64)
    report: str | None = Field(
        None,
        max_length=8_000_000,
        description="The rollout's report as a gradient body's `a3c` metadata entry carries it "
        "(a JSON string: its finished episodes and the worker's statistics).",
    )


@router.get(SHARDS_PATH, responses={**conflict("no run has started, or it has no shards")})
def shards(state: State, request: Request) -> dict[str, Any]:
    """The running run's shards: their epoch, and each one's URL and slice of the parameters."""
    return state.shard_plan(str(request.base_url))


@router.post(
    f"{SHARDS_PATH}/commit",
    responses={**JSON_BODY, **conflict("stale, an outlier, another epoch, no such run"), **_DOWN},
)
async def commit(body: Commit, state: State) -> dict[str, Any]:
    """Admit a push staged on every shard: the version its weights will be at once every shard
    has applied it (fetch them there), whether it was a retry, and the run's summary."""
    # On the event loop, as a gradient push is taken (master/ingress/updates.py): a commit waits
    # for nothing but the state's locks, and a hop to the thread pool was most of its cost.
    return state.commit_sharded(body)
