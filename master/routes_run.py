"""Running the cluster: start and stop a run, worker heartbeats and episode reports, status and
metrics."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse, Response

from a3c_http.exploration import ExplorationError
from a3c_http.model import UnsupportedSpace
from a3c_http.protocol import METRICS_CONTENT_TYPE as METRICS_TYPE
from a3c_http.service import JSON_BODY, conflict, error, protected_router
from master.deps import State
from master.launcher import WorkerListError, normalize_url, parse_workers, read_workers_file
from master.launcher import start_workers as launch
from master.persistence import FolderUnwritable
from master.schemas import OTHER_RUN, EpisodeIn, HeartbeatIn, Seq, TrainIn
from master.state import ModelTooLarge

router = protected_router(tags=["run"])


@router.post(
    "/train",
    status_code=202,
    responses={
        **JSON_BODY,
        **conflict("a run is running: POST /stop it first"),
        503: error("the previous run's last changes cannot be saved (a full disk): no new run"),
    },
)
def train(body: TrainIn, request: Request, state: State) -> JSONResponse:
    settings = state.settings
    try:
        urls = (
            parse_workers(body.workers, "workers")
            if body.workers is not None
            else read_workers_file(settings.workers_file)
        )
    except WorkerListError as exc:
        raise HTTPException(422, str(exc)) from None
    if body.master_url:
        master_url, source = body.master_url, "master_url"
    elif settings.master_url:
        master_url, source = settings.master_url, "A3C_MASTER_URL"
    else:
        master_url, source = str(request.base_url), "the base URL of this request"
    try:
        if "://" not in master_url:
            raise WorkerListError(f"{master_url!r}: expected a URL such as http://10.0.0.10:33333")
        master_url = normalize_url(master_url, default_port=True)
    except WorkerListError as exc:
        raise HTTPException(422, f"{source}: {exc}") from None
    config = body.config()
    try:
        run_id, worker_ids = state.start_run(config, urls)
    except (ModelTooLarge, ExplorationError) as exc:
        raise HTTPException(422, str(exc)) from None
    except FolderUnwritable as exc:
        raise HTTPException(503, str(exc)) from None
    except (UnsupportedSpace, gym.error.Error, TypeError, ValueError) as exc:
        raise HTTPException(
            422, f"env_id/env_kwargs: cannot build {config.env_id!r}: {exc}"
        ) from None
    workers = dict(zip(worker_ids, urls, strict=True))
    results = launch(state.ledger, workers, run_id, state.ledger.config, master_url, settings.token)
    if not any(r["started"] for r in results):
        state.finish("no worker could be started")
    state.check_liveness()
    return JSONResponse(
        {"data": {"run_id": run_id, "master_url": master_url, "workers": results}},
        status_code=202,
    )


@router.post("/stop")
def stop(state: State) -> dict[str, Any]:
    """Idempotent: `stopped` says whether this call ended a running run (and persisted it)."""
    stopped = state.finish("stopped by POST /stop")
    ledger = state.ledger
    return {"data": {"run_id": ledger.run_id, "state": ledger.run_state, "stopped": stopped}}


@router.get("/status")
def status(state: State) -> dict[str, Any]:
    return state.status()


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {METRICS_TYPE: {}}, "description": "Prometheus text format"}},
)
def metrics(request: Request) -> Response:
    """What `/status` shows, and the gradient exchange's latency, for Prometheus to scrape."""
    return Response(request.app.state.metrics.exposition(), media_type=METRICS_TYPE)


@router.post("/heartbeat", responses=JSON_BODY)
def heartbeat(body: HeartbeatIn, state: State) -> dict[str, Any]:
    stats = body.model_dump(exclude={"worker_id", "run_id"})
    return {"data": {"stop": state.heartbeat(body.worker_id, stats, body.run_id)}}


@router.post(
    "/episode",
    responses={**JSON_BODY, **OTHER_RUN},
)
def episode(body: EpisodeIn, state: State, x_a3c_seq: Seq = None) -> dict[str, Any]:
    reply = state.report_episode(body.worker_id, body.reward, body.length, body.run_id, x_a3c_seq)
    return {"data": reply}
