"""A parameter-server shard over HTTP (its state: master/shards/shard.py `Shard`).

The master forks it from its fork server (`serve`) on a socket the master bound, and keeps the
write end of a pipe whose read end the shard watches: when the master ends or is killed the pipe
closes and the shard ends too, so no shard outlives the master that opened it. A shard on
another host is master/shards/app.py's. Either reads the master's settings from the same
environment (its token, TLS, body bounds: a3c_http/server/service.py `install_common`).

Routes: `POST /shard/open` (the master: a run's slice, its optimizer state, its version and the
key of its receipts), `POST /shard/stage` (a worker: its slice of a push's gradients),
`POST /shard/apply` (the master: the admitted pushes, in version order), `GET /shard/weights`
(a worker: the slice once a version is applied), `GET /shard/state` (the master: the slice and
its optimizer's state, to save), `GET /shard/status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import socket
import threading
import time
from multiprocessing.connection import Connection
from typing import Annotated, Any

import torch
import uvicorn
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response

from a3c_http import tuning
from a3c_http.config.settings import Settings
from a3c_http.server import logs
from a3c_http.server.service import install_common, protected_router
from a3c_http.wire.protocol import (
    CONTENT_TYPE,
    MAX_SEQ,
    MAX_SQLITE_INT,
    SEQ_HEADER,
    SHARD_EPOCH_HEADER,
    SHARD_STAGE_PATH,
    SHARD_WEIGHTS_PATH,
    VERSION_HEADER,
    WORKER_ID_HEADER,
)
from master.shards.shard import WEIGHTS_WAIT_S, NotYet, Refused, Shard

# A version this far past the shard's can be no push's the master admitted (its decisions are
# never that far ahead of a live shard): 422 at once rather than a wait.
MAX_AHEAD = 100_000
# The header of the master's own calls (open, apply, state): the secret it gave the shard.
CONTROL_HEADER = "X-A3C-Shard-Control"


def create_app(settings: Settings, control: str, shard: Shard | None = None) -> FastAPI:
    """The shard's app: the workers' routes behind the run's token, the master's also behind
    `control`, a secret the master handed this process at its start (`CONTROL_HEADER`), so a
    worker can stage and fetch but never open, apply or read a shard."""
    shard = shard or Shard()
    app = FastAPI(title="a3c-http parameter-server shard", docs_url=None, redoc_url=None)
    app.state.shard = shard
    router = protected_router()

    def masters(given: Annotated[str | None, Header(alias=CONTROL_HEADER)] = None) -> None:
        if given is None or not hmac.compare_digest(given.encode(), control.encode()):
            raise HTTPException(403, "only the master that started this shard may call it here")

    master = [Depends(masters)]

    def answer(call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except Refused as exc:
            raise HTTPException(exc.status, str(exc)) from None

    @router.post("/shard/open", dependencies=master)
    async def open_(request: Request) -> dict[str, Any]:
        return answer(shard.open, await request.body())

    @router.post(SHARD_STAGE_PATH)
    async def stage(
        request: Request,
        worker: Annotated[str, Header(alias=WORKER_ID_HEADER, max_length=128)],
        seq: Annotated[int, Header(alias=SEQ_HEADER, ge=1, le=MAX_SEQ)],
        epoch: Annotated[str, Header(alias=SHARD_EPOCH_HEADER, max_length=64)],
    ) -> dict[str, Any]:
        return answer(shard.stage, worker, seq, epoch, await request.body())

    # The routes that apply and that wait for a version run on the event loop (no thread of the
    # pool waits: hundreds of workers waiting for their version would take every thread, and the
    # master's next decisions none); `applied` wakes the waiting ones after each batch.
    applied: list[asyncio.Event] = []

    @router.post("/shard/apply", dependencies=master)
    async def apply(body: dict[str, Any]) -> dict[str, Any]:
        decisions = body.get("decisions")
        if not isinstance(decisions, list) or not isinstance(body.get("epoch"), str):
            raise HTTPException(422, "expected {'epoch': str, 'decisions': [...]}")
        try:
            return {"version": answer(shard.apply, body["epoch"], decisions)}
        finally:
            while applied:
                applied.pop().set()

    @router.get(SHARD_WEIGHTS_PATH)
    async def weights(version: Annotated[int, Query(ge=0, le=MAX_SQLITE_INT)] = 0) -> Response:
        if version > shard.version + MAX_AHEAD:
            raise HTTPException(422, f"version {version}: no push has made it (this shard is "
                                     f"at {shard.version})")  # fmt: skip
        deadline = time.monotonic() + WEIGHTS_WAIT_S
        while True:
            try:
                body, at = shard.weights(version, wait_s=0)
                break
            except NotYet:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HTTPException(503, f"version {version} is not applied yet") from None
                event = asyncio.Event()
                applied.append(event)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), left)
            except Refused as exc:
                raise HTTPException(exc.status, str(exc)) from None
        return Response(body, media_type=CONTENT_TYPE, headers={VERSION_HEADER: str(at)})

    @router.get("/shard/state", dependencies=master)
    def state() -> Response:
        return Response(answer(shard.state), media_type=CONTENT_TYPE)

    @router.get("/shard/status")
    def status() -> dict[str, Any]:
        return shard.status()

    app.include_router(router)
    install_common(app, settings, tensor_paths=frozenset({SHARD_STAGE_PATH, "/shard/open"}))
    return app


def _end_with_parent(parent: Connection) -> None:
    """End this process when the master's end of the pipe closes."""

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                parent.recv_bytes()
        os._exit(0)

    threading.Thread(target=watch, name="a3c-shard-parent", daemon=True).start()


def serve(listening: socket.socket, parent: Connection, control: str) -> None:
    """A shard on `listening` until `parent` closes (master/shards/processes.py forks it);
    `control`: the secret of the master's calls (`create_app`)."""
    settings = Settings.from_env()
    logs.configure(settings.log_level, settings.log_format)
    tuning.keep_freed_memory(settings.max_body_bytes)
    torch.set_num_threads(1)
    _end_with_parent(parent)
    config = uvicorn.Config(
        create_app(settings, control), log_level="warning", access_log=False,
        **settings.tls.uvicorn_kwargs(),
    )  # fmt: skip
    uvicorn.Server(config).run(sockets=[listening])
