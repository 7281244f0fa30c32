"""Request bodies of the master's JSON endpoints. Unknown fields are refused (422) except in
heartbeats, whose statistics may grow. Every value must have the JSON type the schema gives it
(strict models): `true` or `"1"` where a number is expected is a 422, not 1."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from a3c_http.algos.registry import read_config, section_schemas
from a3c_http.config.training import TrainConfig
from a3c_http.server.service import conflict
from a3c_http.wire.protocol import MAX_ABS_RETURN, MAX_COUNT, WORKER_ID_PATTERN
from master.api.headers import WorkerId
from master.learning.admission import MAX_LENGTH

Finite = Annotated[float, Field(allow_inf_nan=False)]
# An episode's return, or a statistic of returns (a3c_http/wire/protocol.py MAX_ABS_RETURN): one
# report of 1e308 once made the best score, and a hundred would have solved the run.
Return = Annotated[float, Field(ge=-MAX_ABS_RETURN, le=MAX_ABS_RETURN, allow_inf_nan=False)]
RunId = Annotated[str | None, Field(None, max_length=64)]
# The 409 of the worker messages: they carry a `run_id`, and only registered workers send them.
OTHER_RUN = conflict(
    "`run_id` names another run than the current one, or `worker_id` is not registered in the "
    "run (POST /worker_started); `X-A3C-Stop: 1` tells the worker to stop"
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ScoreIn(Strict):
    data: Return
    worker_id: WorkerId | None = None


class CountIn(Strict):
    data: int = Field(1, ge=1, le=1_000_000_000)


class ValueIn(Strict):
    data: Return


class WorkerStartedIn(Strict):
    worker_id: WorkerId
    url: str | None = Field(None, max_length=2048)
    run_id: RunId = None


class JoinIn(Strict):
    """POST /join: a worker that joins by itself (A3C_MASTER_URL)."""

    name: str = Field(
        min_length=1,
        max_length=128,
        pattern=WORKER_ID_PATTERN,
        description="What the worker calls itself (A3C_WORKER_NAME: by default its host name and "
        "port, in Kubernetes its pod's name), shown in /status beside the id the master gives it.",
    )
    url: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^https?://",
        description="Where the worker can be reached (A3C_WORKER_URL), shown in /status; the "
        "master never calls a worker that joined.",
    )
    run_id: RunId = None
    worker_id: WorkerId | None = Field(
        None,
        description="The id it had in `run_id`: the same run, still running, takes it back under "
        "that id (after a restart of the master, or of its trainer).",
    )


class WorkerDoneIn(Strict):
    worker_id: WorkerId
    error: str | None = Field(None, max_length=20_000)
    run_id: RunId = None


class WorkerStats(BaseModel):
    """What a worker says of its progress: in a heartbeat, or with its gradients."""

    model_config = ConfigDict(extra="ignore", strict=True)
    # Bounded: the master sums them into figures that /metrics and TensorBoard hand to C code
    # (a float, a 64-bit step), where a larger integer would overflow.
    episodes: int | None = Field(None, ge=0, le=MAX_COUNT)
    steps: int | None = Field(None, ge=0, le=MAX_COUNT)
    env_steps: int | None = Field(
        None,
        ge=0,
        le=MAX_COUNT,
        description="Every environment step this worker took in the run, of finished episodes "
        "and of those going on; the master's `env_steps` (what `max_steps` counts) adds up these.",
    )
    steps_per_s: Finite | None = Field(None, ge=0)
    last_reward: Return | None = None
    metrics: dict[Annotated[str, Field(max_length=64)], Finite] | None = Field(
        None, max_length=32, description="train/policy_loss, train/entropy, time/fps, ..."
    )


class HeartbeatIn(WorkerStats):
    worker_id: WorkerId
    run_id: RunId = None


# An episode's return and length, as one item of a rollout report.
EpisodeOut = tuple[Return, Annotated[int, Field(ge=1, le=MAX_LENGTH)]]


class RolloutReport(BaseModel):
    """The `a3c` entry of a gradient body's safetensors metadata (a JSON string): the episodes
    that finished in the rollout the gradients come from, and the worker's statistics, so one
    round trip does the work of `POST /episode` (each) and `POST /heartbeat`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    episodes: list[EpisodeOut] = Field(default_factory=list, max_length=100_000)
    stats: WorkerStats | None = None


class EpisodeIn(Strict):
    worker_id: WorkerId
    reward: Return
    length: int = Field(ge=1, le=MAX_LENGTH)
    run_id: RunId = None


class Where(Strict):
    """The fields of POST /train's body beside the training config: where to find the workers
    and how they reach the master."""

    workers: list[str] | None = Field(
        None,
        max_length=1024,
        description="Worker URLs for the master to start; default: the lines of "
        "A3C_WORKERS_FILE, none when that file does not exist. [] or none: the run waits for "
        "workers that join by themselves (POST /join); any run takes them too.",
    )
    master_url: str | None = Field(
        None,
        max_length=2048,
        description="URL the workers use to reach the master; default: A3C_MASTER_URL, else the "
        "base URL this request was sent to.",
    )



def _train_body_schema() -> dict[str, Any]:
    where = Where.model_json_schema()["properties"]
    return {
        "title": "TrainIn",
        "description": "A training config of any algorithm (its section, by `algo`; absent: "
        "a3c) and where the workers are.",
        "anyOf": [
            {**one, "properties": {**one["properties"], **where}} for one in section_schemas()
        ],
    }


# POST /train's body in /openapi.json: the route reads it itself (`read_train_body`).
TRAIN_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": _train_body_schema()}},
    }
}


def read_train_body(body: dict[str, Any]) -> tuple[TrainConfig, Where, str | None]:
    """POST /train's body as its config (its algorithm's section, strictly typed), where its
    workers are, and the note of a config of before that was upgraded (None: none was). A body
    that does not fit is a RequestValidationError, which every route's 422 reports alike."""
    where = {name: body[name] for name in Where.model_fields if name in body}
    fields = {name: value for name, value in body.items() if name not in where}
    errors: list[Any] = []
    try:
        place = Where.model_validate(where)
    except ValidationError as exc:
        errors += exc.errors()
    try:
        config, note = read_config(fields, strict=True)
    except ValidationError as exc:
        errors += exc.errors()
    if errors:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors])
    return config, place, note
