"""Running the cluster: start and stop a run, worker heartbeats and episode reports, status and
metrics."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit

import gymnasium as gym
from fastapi import Body, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from a3c_http.algos.exploration import ExplorationError
from a3c_http.config.ending import how_it_ends
from a3c_http.config.workerlist import (
    WorkerListError,
    normalize_url,
    parse_workers,
    read_workers_file,
)
from a3c_http.envs.make import MissingDependency
from a3c_http.models.actor_critic import UnsupportedSpace
from a3c_http.net.tls import TLSError
from a3c_http.server.edge import is_loopback
from a3c_http.server.service import JSON_BODY, ErrorBody, conflict, protected_router
from a3c_http.wire.protocol import METRICS_CONTENT_TYPE as METRICS_TYPE
from master.api.deps import State
from master.api.headers import Seq
from master.api.schemas import (
    OTHER_RUN,
    TRAIN_BODY,
    EpisodeIn,
    HeartbeatIn,
    JoinIn,
    read_train_body,
)
from master.background.launcher import UNREACHABLE
from master.background.launcher import start_workers as launch
from master.learning.learner_needs import DeviceUnavailable
from master.persistence.saver import FolderUnwritable
from master.run.ledger import JOIN_RETRY_S
from master.state import ModelTooLarge

router = protected_router(tags=["run"])
REQUEST_URL = "the base URL of this request"


class NoWorkerStarted(ErrorBody):
    """POST /train's 503: no worker could be started, so the run finished at once. `detail`
    says why for each worker; `data` is what the 202 would have carried (the run id, and each
    worker's `started` and `error`). When the previous run's last changes cannot be saved, no
    run begins and there is no `data`."""

    data: dict[str, Any] | None = None


def _own_host(url: str) -> bool:
    """Whether `url`'s host names, wherever it is used, the host that uses it: a loopback
    address, or 0.0.0.0 and :: (a client connecting there reaches its own host)."""
    host = urlsplit(url).hostname
    return is_loopback(host) or host in ("0.0.0.0", "::")


def unreachable_master(master_url: str, urls: list[str]) -> str | None:
    """Why workers on other hosts cannot use a master URL taken from the request: its address
    names, on their hosts, themselves. None when nothing says they cannot."""
    remote = [url for url in urls if not _own_host(url)]
    if not _own_host(master_url) or not remote:
        return None
    return (
        f"the workers at {', '.join(remote)} could not reach the master at {master_url}, the "
        "address this POST /train was sent to, which names their own hosts. Set "
        '"master_url" in the body, or A3C_MASTER_URL on the master, to an address of this host '
        f"that they can reach (e.g. http://10.0.0.10:{urlsplit(master_url).port})"
    )


@router.post(
    "/train",
    status_code=202,
    openapi_extra=TRAIN_BODY,
    responses={
        **JSON_BODY,
        **conflict("a run is running: POST /stop it first"),
        503: {
            "model": NoWorkerStarted,
            "description": "no worker could be started (`data` has each worker's result), or the "
            "previous run's last changes cannot be saved (a full disk): no new run began",
        },
    },
)
def train(
    body: Annotated[dict[str, Any], Body()], request: Request, state: State
) -> JSONResponse:
    config, where, upgraded = read_train_body(body)
    settings = state.settings
    # The default workers file may be absent or empty: the run waits for workers that join. One
    # named by A3C_WORKERS_FILE must be there.
    default_file = "workers_file" not in settings.model_fields_set
    try:
        urls = (
            parse_workers(where.workers, "workers", allow_none=True, served=settings.tls)
            if where.workers is not None
            else read_workers_file(
                settings.workers_file, missing_ok=default_file, served=settings.tls
            )
        )
    except WorkerListError as exc:
        raise HTTPException(422, str(exc)) from None
    if where.master_url:
        master_url, source = where.master_url, "master_url"
    elif settings.master_url:
        master_url, source = settings.master_url, "A3C_MASTER_URL"
    else:
        master_url, source = str(request.base_url), REQUEST_URL
    try:
        if "://" not in master_url:
            raise WorkerListError(f"{master_url!r}: expected a URL such as http://10.0.0.10:33333")
        master_url = normalize_url(master_url, default_port=True)
    except WorkerListError as exc:
        raise HTTPException(422, f"{source}: {exc}") from None
    try:
        settings.tls.require_https(master_url, source)
    except TLSError as exc:
        raise HTTPException(422, str(exc)) from None
    # Said before anything starts: else the workers retry that URL for A3C_MASTER_RETRY_S, the
    # master learns only after start_timeout_s that none runs, and a new POST /train gets 409.
    if source == REQUEST_URL and (problem := unreachable_master(master_url, urls)):
        raise HTTPException(422, problem)
    try:
        run_id, worker_ids = state.start_run(config, urls)
    except (ModelTooLarge, ExplorationError, DeviceUnavailable) as exc:
        raise HTTPException(422, str(exc)) from None
    except MissingDependency as exc:
        raise HTTPException(422, f"env_id: {exc}") from None
    except FolderUnwritable as exc:
        raise HTTPException(503, str(exc)) from None
    except (UnsupportedSpace, gym.error.Error, TypeError, ValueError) as exc:
        raise HTTPException(
            422, f"env_id/env_kwargs: cannot build {config.env_id!r}: {exc}"
        ) from None
    workers = dict(zip(worker_ids, urls, strict=True))
    ends = how_it_ends(state.ledger.config)
    if not workers:
        note = (
            "no worker to start: the run waits for workers that join by themselves (a3c-worker "
            f"with A3C_MASTER_URL={master_url})"
        )
        data = {"run_id": run_id, "master_url": master_url, "ends": ends, "workers": []}
        if upgraded:
            data["upgraded"] = upgraded
        return JSONResponse({"data": {**data, "note": note}}, status_code=202)
    results = launch(
        state.ledger,
        workers,
        run_id,
        state.ledger.config,
        master_url,
        settings.token,
        proxy_from_env=settings.proxy_from_env,
        push_url=state.receivers.url_for(master_url) if state.receivers is not None else None,
    )
    data = {"run_id": run_id, "master_url": master_url, "ends": ends, "workers": results}
    if upgraded:
        data["upgraded"] = upgraded
    if not any(r["started"] for r in results):
        state.finish("no worker could be started")
        why = "; ".join(f"{r['worker_id']} at {r['url']}: {r['error']}" for r in results)
        detail = f"no worker could be started, so run {run_id} finished at once ({why}). " + (
            _what_to_do(results)
        )
        return JSONResponse({"detail": detail, "data": data}, status_code=503)
    state.check_liveness()
    return JSONResponse({"data": data}, status_code=202)


@router.post("/join", responses={**JSON_BODY, **conflict("this run's registry is full")})
def join(body: JoinIn, request: Request, state: State) -> dict[str, Any]:
    """A worker joins by itself (a worker with A3C_MASTER_URL, at its start, after a run and
    after a restart of either): `run` is what POST /start_worker would have told it (its
    `worker_id`, the `run_id`, the `config`, its `exploration`, and `push_url` with receivers), or
    null while no run is running; it asks again after `retry_s` seconds."""
    run = state.join(body.name, body.url, body.run_id, body.worker_id)
    if run is not None and state.receivers is not None:
        run["push_url"] = state.receivers.url_for(str(request.base_url))
    return {"data": {"run": run, "retry_s": JOIN_RETRY_S}}


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


@router.post("/heartbeat", responses={**JSON_BODY, **OTHER_RUN})
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


def _what_to_do(results: list[dict]) -> str:
    """The advice after no worker could be started: start those that did not answer, mend what
    those that answered refused."""
    down = sum(r["error"].startswith(UNREACHABLE) for r in results)
    advice = []
    if down:
        advice.append(
            "Start each worker that did not answer (uvicorn worker.app:app --host H --port P on "
            "its host, with the master's A3C_TOKEN)"
        )
    if down < len(results):
        advice.append(
            ("then mend" if down else "The workers that answered are running: mend")
            + " what they refused, on every worker (for an environment of your own: its module "
            "importable there and named in A3C_ENV_MODULES)"
        )
    return ", ".join(advice) + ", and POST /train again"
