"""The master's fronts: processes that take the workers' gradient pushes on a port of their own,
around the master's process, which owns the parameters (`A3C_FRONTS`, `A3C_FRONTS_BIND`).

One Python process saturates one core: reading a push's HTTP, judging its headers and answering
it with the weights cost the master about as much as the update itself. With fronts, that work
is spread over as many processes, on as many cores, all accepting on one listening socket; each
hands the push it read to the master over a socket pair (master/front.py), and the master does
what only the owner of the run can do: count the push's episodes, screen it, step the optimizer
and save; its answer, the new weights and the run's figures, goes back the same way. So every
guarantee of a push holds as on the master's own port (no lost update, a retry counted once, the
staleness, outlier and run checks, persistence), and what grows with the fronts is the HTTP work
around it. Everything else (runs, status, reports, weights) stays on the master's own port, which
takes pushes too; workers the master starts are told the fronts' URL (`push_url`).

On the master's side each front has a thread that reads its socket and hands each push to the
event loop, where the master's own hot path (master/hotpath.py `push`) applies it as it applies a
push of its own port; the thread then writes the answer back. A front that dies is started
again; the fronts end with the master (their socket pair closes; a killed master's too).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from a3c_http.frames import Frames, frame
from a3c_http.settings import Settings
from master.hotpath import Reply
from master.schemas import PushHeaders

logger = logging.getLogger("a3c.master.fronts")
ROOT = Path(__file__).resolve().parent.parent
# How long a front may take to end once its channel closes, at the master's shutdown.
STOP_WAIT_S = 10.0
# How long a starting master waits for its port to be free (see `bind`).
BIND_WAIT_S = 10.0


def bind(address: str, wait_s: float = BIND_WAIT_S) -> socket.socket:
    """A listening socket on `host:port` (an IPv6 host in brackets) for the fronts to share. The
    fronts of a master that was just killed may hold the port for a moment: tried again for up
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
                    f"A3C_FRONTS_BIND={address}: the fronts cannot listen there ({exc.strerror})"
                ) from None
            time.sleep(0.1)  # the polling interval of a port another process is giving up
            continue
        sock.listen(2048)
        sock.set_inheritable(True)
        return sock


class _Front:
    """One front process and the master's end of its socket pair."""

    def __init__(self, index: int, listening: socket.socket, log_path: Path | None) -> None:
        self.index = index
        self.sock, theirs = socket.socketpair()
        theirs.set_inheritable(True)
        env = {
            **os.environ,
            # this checkout's master, whatever the working directory
            "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "master.front", str(listening.fileno()), str(theirs.fileno())],
            env=env,
            pass_fds=(listening.fileno(), theirs.fileno()),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        # Answers are written by a thread of the front's own: a front that stops reading must
        # not hold the master's event loop, where the answers are made.
        self.outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.writer = threading.Thread(target=self._write, daemon=True, name=f"a3c-front-{index}-w")
        self.writer.start()

    def send(self, head: dict[str, Any], body: bytes) -> None:
        self.outbox.put(frame(head, body))

    def _write(self) -> None:
        while (data := self.outbox.get()) is not None:
            try:
                self.sock.sendall(data)
            except OSError:  # the front is gone; its clients see their connections close
                return


class Fronts:
    """Starts `count` fronts on `address`, serves their pushes with `push` (the master's hot
    path, run on `loop`), restarts a front that dies, and ends them all at `close`."""

    def __init__(
        self,
        settings: Settings,
        push: Callable[[PushHeaders, bytes], Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.count = settings.fronts
        self.push = push
        self.loop = loop
        self.listening = bind(settings.fronts_bind or "")
        self.port = self.listening.getsockname()[1]
        self._closing = threading.Event()
        self.forwarded = 0  # pushes the fronts handed to the master
        self._count_lock = threading.Lock()  # one thread a front adds to it
        self._fronts: list[_Front] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> Fronts:
        for index in range(self.count):
            self._start(index)
        return self

    def _start(self, index: int) -> None:
        front = _Front(index, self.listening, None)
        self._fronts.append(front)
        thread = threading.Thread(
            target=self._serve, args=(front,), daemon=True, name=f"a3c-front-{index}"
        )
        self._threads.append(thread)
        thread.start()

    def url_for(self, master_url: str) -> str:
        """The fronts' URL for workers that reach the master at `master_url`: its scheme and,
        when the fronts listen on every address, its host."""
        parts = urlsplit(master_url)
        host = self.listening.getsockname()[0]
        if host in ("0.0.0.0", "::"):
            host = parts.hostname or host
        return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{self.port}"

    def status(self) -> dict[str, Any]:
        """What /status shows of the fronts."""
        alive = [f.proc.pid for f in self._fronts if f.proc.poll() is None]
        return {
            "count": self.count,
            "alive": len(alive),
            "pids": alive,
            "port": self.port,
            "pushes": self.forwarded,
        }

    def _serve(self, front: _Front) -> None:
        frames = Frames()
        while True:
            try:
                data = front.sock.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                break
            for head, body in frames.feed(data):
                with self._count_lock:
                    self.forwarded += 1
                headers = PushHeaders.model_construct(**head["headers"])  # judged by the front
                done = asyncio.run_coroutine_threadsafe(self.push(headers, body), self.loop)
                done.add_done_callback(lambda d, call=head["id"]: self._answer(front, call, d))
        front.outbox.put(None)
        front.writer.join(STOP_WAIT_S)
        front.sock.close()
        if not self._closing.is_set():  # the front died: another takes its place
            code = front.proc.wait()
            logger.warning("front %d ended (exit code %s): starting it again", front.index, code)
            self._fronts.remove(front)
            self._start(front.index)

    def _answer(self, front: _Front, call: int, done: Any) -> None:
        try:
            status, headers, content = done.result()
        except Exception:  # the master's own 500: the front answers it too
            logger.exception("a push through front %d failed", front.index)
            status, headers, content = _FAILED
        front.send({"id": call, "status": status, "headers": headers}, content)

    def close(self) -> None:
        """End every front (their pushes in flight go unanswered) and free the port."""
        self._closing.set()
        for front in self._fronts:
            with contextlib.suppress(OSError):
                front.sock.shutdown(socket.SHUT_RDWR)
        for front in self._fronts:
            try:
                front.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                front.proc.kill()
                front.proc.wait()
        self.listening.close()


_FAILED: Reply = (
    500, [("content-type", "application/json")], b'{"detail": "Internal Server Error"}'
)
