"""The master's receivers: processes that take the workers' pushes (gradients and experience) on a
port of their own, around the master's process, which owns the parameters (`A3C_RECEIVERS`,
`A3C_RECEIVERS_BIND`).

One Python process saturates one core: reading a push's HTTP, judging its headers and answering it
with the weights cost the master about as much as the update itself. With receivers, that work is
spread over as many processes, on as many cores, all accepting on one listening socket; each hands
the push it read to the master over a socket pair (master/ingress/receiver.py), and the master does
what only the owner of the run can do: count the push's episodes, screen it, step the optimizer or
queue the rollout for the learner, and save; its answer, the new weights and the run's summary, goes
back the same way. So every guarantee of a push holds as on the master's own port (no lost update, a
retry counted once, the staleness, outlier and run checks, persistence), and what grows with the
receivers is the HTTP work around it. Everything else (runs, status, reports, weights) stays on the
master's own port, which takes pushes too; workers the master starts are told the receivers' URL
(`push_url`).

On the master's side each receiver's socket pair is a connection of the master's event loop
(`_Channel`): the frames it reads are pushes, each applied by the master's own hot path
(master/ingress/updates.py `take_push`) as a push of its own port is, and each answer is written
back by the loop's transport, which never blocks: a receiver that stops reading gets no more of its
pushes read until its answers drain. A push answered at once (a gradient push in async mode) needs
no task, and the answers to one read leave in one write. No thread stands between a receiver and the
loop: crossing threads cost the master as much as the receivers saved it (docs/performance.md, "A
master on more than one core: receivers"). A receiver that dies is started again; the receivers end
with the master (their socket pair closes; a killed master's too).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from a3c_http.config.settings import Settings
from a3c_http.wire.frames import FrameReader, frame_parts
from master.api.headers import PushHeaders
from master.ingress.route import Reply

logger = logging.getLogger("a3c.master.receivers")
ROOT = Path(__file__).resolve().parents[2]
# How long a receiver may take to end once its channel closes, at the master's shutdown.
STOP_WAIT_S = 10.0
# How long a starting master waits for its port to be free (see `bind`).
BIND_WAIT_S = 10.0


def bind(address: str, wait_s: float = BIND_WAIT_S) -> socket.socket:
    """A listening socket on `host:port` (an IPv6 host in brackets) for the receivers to share. The
    receivers of a master that was just killed may hold the port for a moment: tried again for up
    to `wait_s`; then RuntimeError, which stops the master with a message that names it."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    deadline = time.monotonic() + wait_s
    while True:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{Settings.variable('receivers_bind')}={address}: the receivers cannot "
                    f"listen there ({exc.strerror})"
                ) from None
            time.sleep(0.1)  # the polling interval of a port another process is giving up
            continue
        sock.listen(2048)
        sock.set_inheritable(True)
        return sock


class _Receiver:
    """One receiver process and the master's end of its socket pair."""

    def __init__(self, index: int, listening: socket.socket) -> None:
        self.index = index
        self.sock, theirs = socket.socketpair()
        theirs.set_inheritable(True)
        env = {
            **os.environ,
            # this checkout's master, whatever the working directory
            "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
        }
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "master.ingress.receiver",
                str(listening.fileno()), str(theirs.fileno()),
            ],
            env=env,
            pass_fds=(listening.fileno(), theirs.fileno()),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.channel: _Channel | None = None  # once the loop has taken the socket


class _Channel(asyncio.BufferedProtocol):
    """The master's end of one receiver's socket pair, on the event loop: each frame read is a
    push, applied as the master's own port applies one, and its answer framed back. A push's
    body is read into its own memory, which becomes its gradient vector (a3c_http/wire/frames.py
    `FrameReader`)."""

    def __init__(self, receivers: Receivers, receiver: _Receiver) -> None:
        self.receivers = receivers
        self.receiver = receiver
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        answers: list[bytes] = []  # one write for all the pushes of this read answered at once
        for head, body in self.reader.filled(nbytes):
            self.receivers.forwarded += 1
            call = head["id"]
            try:
                # Judged by the receiver already: validating them again (by their header names)
                # costs less than pydantic's model_construct.
                headers = PushHeaders.model_validate(head["headers"])
                reply = self.receivers.take_push(head["path"], headers, body)
            except Exception:
                reply = self._failed()
            if isinstance(reply, tuple):
                answers.extend(_answer_parts(call, reply))
            else:
                self.receivers.spawn(self._answer_later(call, reply))
        self._write(answers)

    async def _answer_later(self, call: int, pending: Awaitable[Reply]) -> None:
        try:
            reply = await pending
        except Exception:
            reply = self._failed()
        self._write(_answer_parts(call, reply))

    def _failed(self) -> Reply:
        """The master's own 500, which the receiver answers too."""
        logger.exception("a push through receiver %d failed", self.receiver.index)
        return _FAILED

    def _write(self, parts: list[bytes]) -> None:
        transport = self.transport
        if parts and transport is not None and not transport.is_closing():
            transport.writelines(parts)

    # A receiver that stops reading its answers: read none of its pushes until they drain.
    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.receivers.lost(self.receiver)


class Receivers:
    """Starts `count` receivers on `address`, serves their pushes with `take_push` (the master's hot
    path, run on `loop`), restarts a receiver that dies, and ends them all at `close`."""

    def __init__(
        self,
        settings: Settings,
        take_push: Callable[[str, PushHeaders, bytes], Reply | Awaitable[Reply]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.count = settings.receivers
        self.take_push = take_push
        self.loop = loop
        self.listening = bind(settings.receivers_bind or "")
        self.port = self.listening.getsockname()[1]
        self._closing = False
        self.forwarded = 0  # pushes the receivers handed to the master (counted on the loop)
        self._receivers: list[_Receiver] = []
        self._tasks: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    def spawn(self, coroutine: Any) -> None:
        """Run `coroutine` as a task of the loop, held until it is done."""
        task = self.loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def start(self) -> Receivers:
        """Start the receivers; their channels join the loop as it runs (called on the loop)."""
        for index in range(self.count):
            self._start(index)
        return self

    def _start(self, index: int) -> None:
        receiver = _Receiver(index, self.listening)
        self._receivers.append(receiver)

        def channel() -> _Channel:
            receiver.channel = _Channel(self, receiver)
            return receiver.channel

        self.spawn(self.loop.connect_accepted_socket(channel, sock=receiver.sock))

    def lost(self, receiver: _Receiver) -> None:
        """A receiver's channel closed: at the master's shutdown, or the receiver died, and another
        takes its place once it has ended (waited for off the loop)."""
        if self._closing:
            return
        self.spawn(self._replace(receiver))

    async def _replace(self, receiver: _Receiver) -> None:
        code = await asyncio.to_thread(receiver.proc.wait)
        if self._closing:
            return
        logger.warning("receiver %d ended (exit code %s): starting it again", receiver.index, code)
        self._receivers.remove(receiver)
        self._start(receiver.index)

    def url_for(self, master_url: str) -> str:
        """The receivers' URL for workers that reach the master at `master_url`: its scheme and,
        when the receivers listen on every address, its host."""
        parts = urlsplit(master_url)
        host = self.listening.getsockname()[0]
        if host in ("0.0.0.0", "::"):
            host = parts.hostname or host
        return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{self.port}"

    def status(self) -> dict[str, Any]:
        """What /status shows of the receivers."""
        alive = [f.proc.pid for f in self._receivers if f.proc.poll() is None]
        return {
            "count": self.count,
            "alive": len(alive),
            "pids": alive,
            "port": self.port,
            "pushes": self.forwarded,
        }

    def close(self) -> None:
        """End every receiver (their pushes in flight go unanswered) and free the port."""
        self._closing = True
        for receiver in self._receivers:
            if receiver.channel is not None and receiver.channel.transport is not None:
                receiver.channel.transport.abort()
            with contextlib.suppress(OSError):
                receiver.sock.shutdown(socket.SHUT_RDWR)
        for receiver in self._receivers:
            try:
                receiver.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                receiver.proc.kill()
                receiver.proc.wait()
        self.listening.close()


def _answer_parts(call: int, reply: Reply) -> list[bytes]:
    status, headers, content = reply
    return list(frame_parts({"id": call, "status": status, "headers": headers}, content))


_FAILED: Reply = (
    500, [("content-type", "application/json")], b'{"detail": "Internal Server Error"}'
)
