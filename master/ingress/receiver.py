"""A receiver of the master: a process that takes the workers' pushes on the receivers' address and
hands them to the master, so that reading, judging and answering pushes use more cores than the one
the master's own process has (master/ingress/receivers.py starts them).

A receiver serves `POST /gradients` and `POST /experience` exactly as the master's own hot path does
(master/ingress/updates.py `UpdateRoute`, behind the same gate, header bounds and body limit:
a3c_http/server/service.py `install_common`, with the same settings, read from the same
environment), but its `push` sends
the push's headers and body to the master over a socket pair and answers with what the master
answers: the master alone counts, screens, steps and saves, so every guarantee of a push holds
as it does on the master's own port. Everything but those pushes and `GET /healthz` is for the
master's own port: 404 here.

    python -m master.ingress.receiver LISTEN_FD CHANNEL_FD   (the descriptors of its two sockets)

A receiver ends when its channel closes: the master ended (or was killed), and with it every push
the receiver could still answer.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from a3c_http import tuning
from a3c_http.config.settings import Settings
from a3c_http.server import logs
from a3c_http.server.service import install_common
from a3c_http.wire.frames import LENGTHS, decode_head, frame_parts
from master.api.headers import TENSOR_PATHS, PushHeaders
from master.ingress.route import Reply, UpdateRoute


class Channel:
    """The receiver's end of its socket pair with the master: pushes out, answers back, by id."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[tuple[dict[str, Any], bytes]]] = {}
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> asyncio.Task:
        """Connect the socket to the running loop; the returned task reads the answers, and
        ends the process when the master is gone."""
        reader, self._writer = await asyncio.open_unix_connection(sock=self.sock)
        return asyncio.create_task(self._read(reader))

    async def push(self, path: str, headers: PushHeaders, body: bytes) -> Reply:
        call = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._waiting[call] = answer
        assert self._writer is not None
        # By their header names, which the master validates them by again
        # (master/ingress/receivers.py).
        given = headers.model_dump(by_alias=True, exclude_none=True)
        head = {"id": call, "path": path, "headers": given}
        self._writer.writelines(frame_parts(head, body))  # no join
        head, content = await answer
        return head["status"], [tuple(pair) for pair in head["headers"]], content

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                head_len, body_len = LENGTHS.unpack(await reader.readexactly(LENGTHS.size))
                head = decode_head(await reader.readexactly(head_len))
                content = await reader.readexactly(body_len)
                answer = self._waiting.pop(head["id"], None)
                if answer is not None and not answer.done():
                    answer.set_result((head, content))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        # The master is gone: nothing a receiver takes can be answered any more.
        os._exit(0)


def create_app(settings: Settings, channel: Channel) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reading = await channel.open()
        try:
            yield
        finally:
            reading.cancel()

    app = FastAPI(
        title="a3c-http master receiver", lifespan=lifespan, docs_url=None, redoc_url=None,
        openapi_url=None,
    )
    app.add_middleware(UpdateRoute, push=channel.push)
    install_common(app, settings, tensor_paths=TENSOR_PATHS)
    return app


def main(listen_fd: int, channel_fd: int) -> None:
    settings = Settings.from_env()
    logs.configure(settings.log_level, settings.log_format)
    tuning.keep_freed_memory(settings.max_body_bytes)
    listening = socket.socket(fileno=listen_fd)
    channel = Channel(socket.socket(fileno=channel_fd))
    config = uvicorn.Config(
        create_app(settings, channel), log_level="warning", access_log=False, lifespan="on",
        **settings.tls.uvicorn_kwargs(),  # HTTPS, and client certificates, as the master's port
    )
    uvicorn.Server(config).run(sockets=[listening])


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
