"""The master: `uvicorn master.app:app --port 33333`."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from a3c_http import tuning
from a3c_http.config.settings import Settings
from a3c_http.server import logs
from a3c_http.server.service import install_common
from a3c_http.store.runstore import RunDirInUse
from a3c_http.wire.protocol import STOP_HEADER
from a3c_http.wire.tensors import WireError
from master.api import original, run, shards, view, weights
from master.api.headers import TENSOR_PATHS
from master.api.metrics import MasterMetrics
from master.background import housekeeping
from master.errors import Invalid, Unavailable
from master.ingress.commit import CommitRoute
from master.ingress.receivers import Receivers
from master.ingress.route import UpdateRoute
from master.ingress.updates import push, take_push
from master.persistence import tensorboard
from master.persistence.scalars import Sink
from master.persistence.wandb_sink import WandB
from master.state import ClusterState, StateConflict

# How long a stopping master waits for a save in progress before its own last save.
SHUTDOWN_SAVE_WAIT_S = 10.0


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    logs.configure(settings.log_level, settings.log_format)
    # The master serves many small requests; one intra-op thread avoids oversubscribing the cores
    # that the workers on the same host need.
    torch.set_num_threads(1)
    tuning.keep_freed_memory(settings.max_body_bytes)
    state = ClusterState(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        # Where the run's scalars go (master/persistence/scalars.py).
        sinks: list[Sink] = []
        if tensorboard.available():
            sinks.append(tensorboard.TensorBoard(settings.run_dir))
        if settings.wandb_project:
            ledger = state.ledger  # a run over before this master started gets no W&B run
            over = ledger.run_id if ledger.run_state == "finished" else None
            sinks.append(WandB(settings.run_dir, settings.wandb_project, over))
        thread = threading.Thread(
            target=housekeeping.run, args=(state, stop, sinks), daemon=True, name="a3c-housekeeping"
        )
        thread.start()
        state.evaluator.start()
        if settings.receivers:
            loop = asyncio.get_running_loop()
            state.receivers = Receivers(settings, own_take_push, loop).start()
        # Everything built so far lives as long as the process: out of the collector's sight.
        tuning.freeze_startup_objects()
        try:
            yield
        finally:
            if state.receivers is not None:
                state.receivers.close()
            stop.set()
            thread.join(timeout=10)
            state.evaluator.close()
            try:
                # A save that fails is logged, not raised, and one stuck on a disk that never
                # answers is not waited for: the process ends and gives up the folder either way
                # (the last save on disk then says no clean shutdown, so a resume skips versions).
                state.persist(force=True, clean=True, wait_s=SHUTDOWN_SAVE_WAIT_S)
            finally:
                state.close()

    # FastAPI's /docs and /redoc load from a CDN: install_common serves /docs from the package.
    app = FastAPI(
        title="a3c-http master", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.cluster = state
    app.state.metrics = MasterMetrics(state.status)
    own_push = functools.partial(push, state, app.state.metrics)
    own_take_push = functools.partial(take_push, state, app.state.metrics)  # the receivers' pushes
    # The routes of the workers' training loop: hundreds of requests a second. The 409s of their
    # updates are part of the loop too (stale pushes, and after a restart every push computed
    # before it): counted in updates_rejected_by, summed up by the progress line.
    hot = {"/gradients", "/experience", "/episode", "/heartbeat", "/global_model_weights",
           "/target_model_weights", "/local_model_weights"}  # fmt: skip
    quiet = settings.access_log == "quiet"
    # Inside the gate and the body limit that install_common adds (the last added runs first).
    app.add_middleware(UpdateRoute, push=own_push)
    app.add_middleware(CommitRoute, state=state)  # a push's commit in a run with shards
    install_common(
        app,
        settings,
        quiet_paths=hot if quiet else None,
        quiet_conflicts={"/gradients", "/experience", "/local_model_weights"} if quiet else None,
        public_paths=view.PUBLIC_PATHS,
        tensor_paths=TENSOR_PATHS,
    )
    for module in (original, weights, run, view, shards):
        app.include_router(module.router)
    app.include_router(view.pages)

    @app.exception_handler(StateConflict)
    async def _conflict(request: Request, exc: StateConflict) -> JSONResponse:
        headers = {STOP_HEADER: "1"} if exc.stop else None
        return JSONResponse({"detail": str(exc)}, status_code=409, headers=headers)

    @app.exception_handler(Unavailable)
    async def _unavailable(request: Request, exc: Unavailable) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse({"detail": str(exc)}, status_code=503, headers=headers)

    @app.exception_handler(WireError)
    @app.exception_handler(Invalid)
    async def _invalid(request: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    return app


def __getattr__(name: str) -> FastAPI:
    # `uvicorn master.app:app` builds the app on first access, so importing this module (tests,
    # tools) has no side effects such as creating the run folder.
    if name == "app":
        global app
        try:
            app = create_app()
        except RunDirInUse as exc:
            if exc.sibling:  # `uvicorn --workers N`: end the whole server, not just this process
                os.kill(os.getppid(), signal.SIGTERM)
            raise SystemExit(f"a3c-http master: {exc}") from None
        except ValueError as exc:  # a bad setting: say which, without a traceback
            raise SystemExit(f"a3c-http master: {exc}") from None
        return app
    raise AttributeError(name)
