"""The master: `uvicorn master.app:app --port 33333`."""

from __future__ import annotations

import gc
import os
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from a3c_http import logs
from a3c_http.config import Settings
from a3c_http.protocol import STOP_HEADER
from a3c_http.service import install_common
from a3c_http.store import RunDirInUse
from a3c_http.wire import WireError
from master import routes_run, routes_seed, routes_view, routes_weights, tensorboard
from master.events import ProgressLog
from master.metrics import MasterMetrics
from master.state import ClusterState, StateConflict


def _housekeeping(
    state: ClusterState, stop: threading.Event, board: tensorboard.TensorBoard | None
) -> None:
    """Mark silent workers lost, persist at most `persist_interval_s` after a change, write
    the TensorBoard scalars every `tensorboard.INTERVAL_S` (when the extra is installed) and log
    the progress line every `log_progress_s`."""
    progress = ProgressLog(state.settings.log_progress_s)
    interval = state.settings.persist_interval_s
    tick = min(0.5, interval)
    ticks_per_persist = max(1, round(interval / tick))
    ticks_per_board = max(1, round(tensorboard.INTERVAL_S / tick))
    n = 0
    while not stop.wait(tick):
        state.check_liveness()
        n += 1
        if n % ticks_per_persist == 0:
            state.persist()
        if board is not None and n % ticks_per_board == 0:
            board.tick(state.status())
        progress.tick(state.status)
    if board is not None:
        board.tick(state.status())  # the run's last figures
        board.close()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    logs.configure(settings.log_level, settings.log_format)
    # The master serves many small requests; one intra-op thread avoids oversubscribing the cores
    # that the workers on the same host need.
    torch.set_num_threads(1)
    state = ClusterState(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        board = tensorboard.TensorBoard(settings.run_dir) if tensorboard.available() else None
        thread = threading.Thread(
            target=_housekeeping, args=(state, stop, board), daemon=True, name="a3c-housekeeping"
        )
        thread.start()
        state.evaluator.start()
        # Everything built so far (torch, FastAPI, the app) lives as long as the process: out of
        # the garbage collector's sight, a full collection takes microseconds instead of ~90 ms,
        # which would otherwise land on the latency of whichever requests it interrupts.
        gc.freeze()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=10)
            state.evaluator.close()
            try:
                state.persist(force=True, clean=True)
            finally:
                state.close()

    app = FastAPI(title="a3c-http master", version="0.1.0", lifespan=lifespan)
    app.state.cluster = state
    app.state.metrics = MasterMetrics(state.status)
    # The routes of the workers' training loop: hundreds of requests a second.
    hot = {"/gradients", "/episode", "/heartbeat", "/global_model_weights", "/local_model_weights"}
    install_common(
        app,
        settings,
        quiet_paths=hot if settings.access_log == "quiet" else None,
        public_paths=routes_view.PUBLIC_PATHS,
        tensor_paths=routes_weights.TENSOR_PATHS,
    )
    for module in (routes_seed, routes_weights, routes_run, routes_view):
        app.include_router(module.router)
    app.include_router(routes_view.pages)

    @app.exception_handler(StateConflict)
    async def _conflict(request: Request, exc: StateConflict) -> JSONResponse:
        headers = {STOP_HEADER: "1"} if exc.stop else None
        return JSONResponse({"detail": str(exc)}, status_code=409, headers=headers)

    @app.exception_handler(WireError)
    async def _bad_tensors(request: Request, exc: WireError) -> JSONResponse:
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
