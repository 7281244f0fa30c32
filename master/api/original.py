"""The original design's endpoints, under its names, each a locked, atomic
operation on the master's state (mutations are POST, never GET)."""

from __future__ import annotations

from typing import Any

from a3c_http.server.service import JSON_BODY, protected_router
from master.api.deps import State
from master.api.schemas import OTHER_RUN, CountIn, ScoreIn, ValueIn, WorkerDoneIn, WorkerStartedIn

router = protected_router(tags=["original design"])


@router.get("/best_score")
def get_best_score(state: State) -> dict[str, Any]:
    return {"data": state.ledger.stats.best_score}


@router.post("/best_score", responses=JSON_BODY)
def post_best_score(body: ScoreIn, state: State) -> dict[str, Any]:
    best, raised = state.ledger.original.raise_best(body.data)
    return {"data": best, "raised": raised}


@router.get("/global_episode")
def get_global_episode(state: State) -> dict[str, Any]:
    return {"data": state.ledger.stats.global_episode}


@router.post("/global_episode", responses=JSON_BODY)
def post_global_episode(state: State, body: CountIn | None = None) -> dict[str, Any]:
    return {"data": state.ledger.original.add_episodes(body.data if body else 1)}


@router.get("/global_moving_average")
def get_moving_average(state: State) -> dict[str, Any]:
    return {"data": state.ledger.stats.moving_average}


@router.post("/global_moving_average", responses=JSON_BODY)
def post_moving_average(body: ValueIn, state: State) -> dict[str, Any]:
    return {"data": state.ledger.original.fold_average(body.data)}


@router.post("/create_queue")
def create_queue(state: State) -> dict[str, Any]:
    state.ledger.original.clear_queue()
    return {"data": {"length": 0}}


@router.post("/queue", responses=JSON_BODY)
def post_queue(body: ValueIn, state: State) -> dict[str, Any]:
    return {"data": {"length": state.ledger.original.push_queue(body.data)}}


@router.get("/queue")
def get_queue(state: State) -> dict[str, Any]:
    value = state.ledger.original.pop_queue()
    return {"data": value, "empty": value is None}


@router.post("/worker_started", responses={**JSON_BODY, **OTHER_RUN})
def worker_started(body: WorkerStartedIn, state: State) -> dict[str, Any]:
    state.worker_started(body.worker_id, body.url, body.run_id)
    run_id = state.ledger.run_id
    return {"data": {"worker_id": body.worker_id, "state": "running", "run_id": run_id}}


@router.post("/worker_done", responses={**JSON_BODY, **OTHER_RUN})
def worker_done(body: WorkerDoneIn, state: State) -> dict[str, Any]:
    worker_state = state.worker_done(body.worker_id, body.error, body.run_id)
    return {"data": {"worker_id": body.worker_id, "state": worker_state}}


@router.get("/workers_status")
def workers_status(state: State) -> dict[str, Any]:
    state.check_liveness()
    ledger = state.ledger
    active = ledger.active_workers()
    return {"data": {"active": active, "done": active == 0, "workers": ledger.workers_public()}}
