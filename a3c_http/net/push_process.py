"""The push process: a worker's gradient pushes leave its process.

httpx and h11 are Python (about 0.6 ms of CPU a push), and a sender or reader thread in the worker
takes the GIL from the rollout's torch calls, so the worker hands each push to a child process
(`python -m a3c_http.net.push_process`, which imports httpx and a3c_http.net.transport, not torch)
and goes on (figures: docs/performance.md, "Capacity"). Its training thread writes each request
into a pipe and takes the replies out of the other between rollouts (`PushProcess.poll`, which the
futures of the pushes call); the worker has no thread of its own for them. The round trip the
pipeline times a push by is the child's (from the request's hand-over to its reply there),
however late the training thread reads the reply.

The pipes carry frames (a3c_http/wire/frames.py): 8 bytes (the lengths of a JSON head and of a body,
little-endian uint32), the head, the body. To the child: first `{"options": {...}, "threads": n}`
(a3c_http.net.transport's `Transport` arguments, the log settings and ids), then requests `{"id",
"method", "path", "headers", "timeout"}` with their bodies, and `{"stop": true}` when the worker is
told to stop (a request waiting for its reply or to be retried ends with Stopped). From the child:
`{"id", "status", "headers", "retries"}` with the reply's body, or `{"id", "error", "message",
"retries"}` when the request failed for good (both with `arrived_at`, the child's
time.monotonic() when the reply came), and `{"retries"}` at each retry (the worker's /status
shows them as they happen). The child retries as the in-process client does; it ends when its stdin
closes, so it never outlives the worker.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    Future,
    ThreadPoolExecutor,
    wait,
)
from contextlib import suppress
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from a3c_http.net.transport import (
    A3CError,
    MasterUnavailable,
    ProtocolError,
    Stopped,
    Transport,
    check,
)
from a3c_http.server import logs
from a3c_http.wire.frames import Frames, widen_pipe, write_frame

_ERRORS: dict[str, type[A3CError]] = {
    "unavailable": MasterUnavailable,
    "stopped": Stopped,
    "protocol": ProtocolError,
}
# How often a wait for replies looks at the stop event while none comes.
_STOP_POLL_S = 0.1


class Reply(NamedTuple):
    """A reply under 400 as the push process hands it to `convert`: without an httpx.Response,
    whose case-insensitive headers took 0.07 ms of the worker's training thread a reply."""

    status_code: int
    headers: dict[str, str]  # by lower-case name
    content: bytes


class PushFuture(Future):
    """A push's future, completed by whoever asks about it: `done()` takes in the replies that
    have come, `result()` and `exception()` wait for its own, in the caller's thread (the
    module's docstring)."""

    def __init__(self, owner: PushProcess, convert: Callable[[Reply], Any]) -> None:
        super().__init__()
        self.owner = owner
        self.convert = convert
        self.sent_at = time.monotonic()
        self.arrived_at: float | None = None  # when the child had the reply (time.monotonic)

    @property
    def round_trip_s(self) -> float | None:
        """From the request's hand-over to the child to its reply there: what a reader thread
        would have seen, however late the caller takes the reply in."""
        return None if self.arrived_at is None else max(0.0, self.arrived_at - self.sent_at)

    def done(self) -> bool:
        if not super().done():
            self.owner.poll()
        return super().done()

    def result(self, timeout: float | None = None) -> Any:
        wait_for_replies([self], every=True, timeout_s=timeout)
        return super().result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        wait_for_replies([self], every=True, timeout_s=timeout)
        return super().exception(0)


def wait_for_replies(
    futures: Collection[Future], every: bool = False, timeout_s: float | None = None
) -> None:
    """Wait until one of `futures` is done (`every`: all of them), or `timeout_s` has passed.
    PushFutures are completed here by reading their process's replies; other futures (a sender
    thread's) as concurrent.futures.wait does."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        pending = [f for f in futures if not f.done()]
        if not pending or (not every and len(pending) < len(futures)):
            return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        owner = next((f.owner for f in pending if isinstance(f, PushFuture)), None)
        if owner is None:
            wait(pending, left, ALL_COMPLETED if every else FIRST_COMPLETED)
            return
        owner.poll(_STOP_POLL_S if left is None else min(left, _STOP_POLL_S))


class PushProcess:
    """The worker's side: starts the child, sends it requests, and completes their futures as
    their replies are read (`poll`)."""

    def __init__(self, options: dict[str, Any], threads: int, stop: threading.Event) -> None:
        """`options`: `Transport`'s arguments (base_url, token, timeout_s, retry_deadline_s,
        backoff_s, max_backoff_s, max_reply_bytes, proxy_from_env) with log_level, log_format,
        run_id and worker_id; `threads`: requests the child sends at once; `stop`: the worker's
        stop event."""
        root = str(Path(__file__).resolve().parents[2])  # this a3c_http, not another one
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "a3c_http.net.push_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
            bufsize=0,
        )
        self._in = self.proc.stdin.fileno()
        self._out = self.proc.stdout.fileno()
        for fd in (self._in, self._out):
            widen_pipe(fd)
        os.set_blocking(self._out, False)
        self._stop = stop
        self._stop_sent = False
        self._lock = threading.Lock()  # the pending futures, and one writer at a time
        self._reading = threading.Lock()  # one reader of the replies at a time
        self._frames = Frames()
        self._pending: dict[int, PushFuture] = {}
        self._ids = itertools.count(1)
        self._ended: A3CError | None = None
        self._retries = 0  # the child's retries so far
        write_frame(self._in, {"options": options, "threads": max(1, threads)})

    @property
    def retries(self) -> int:
        """The child's retries so far, as they happen (the replies that came are read first)."""
        self.poll()
        return self._retries

    def submit(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        content: bytes,
        timeout: float,
        convert: Callable[[Reply], Any],
    ) -> PushFuture:
        """Send one request; its future gets `convert` of the reply, or the error it failed with
        for good (MasterUnavailable, Stopped, ProtocolError), or the one a 4xx or 5xx reply
        means (transport.check), or one `convert` raised."""
        future = PushFuture(self, convert)
        head = {"method": method, "path": path, "headers": list(headers.items())}
        with self._lock:
            if self._ended is not None:
                future.set_exception(self._ended)
                return future
            call_id = next(self._ids)
            self._pending[call_id] = future
            try:
                write_frame(self._in, {**head, "id": call_id, "timeout": timeout}, content)
            except OSError as exc:  # the child is gone: reading its pipe fails what is pending
                self._pending.pop(call_id, None)
                future.set_exception(MasterUnavailable(f"the push process is gone: {exc}"))
        return future

    def poll(self, timeout_s: float = 0.0) -> None:
        """Complete the futures whose replies have come, waiting up to `timeout_s` for one; and
        tell the child once when the worker is told to stop (a request waiting for its reply or
        to be retried ends then). Returns at once while another thread reads."""
        reading = self._reading
        taken = reading.acquire(timeout=timeout_s) if timeout_s > 0 else reading.acquire(False)
        if not taken:
            return
        try:
            if self._stop.is_set() and not self._stop_sent:
                self._stop_sent = True
                with self._lock, suppress(OSError):
                    write_frame(self._in, {"stop": True})
            if self._ended is not None:
                return
            if timeout_s > 0:
                select.select([self._out], [], [], timeout_s)
            while True:
                try:
                    data = os.read(self._out, 1 << 20)
                except BlockingIOError:
                    return
                if not data:
                    self._child_ended()
                    return
                for head, body in self._frames.feed(data):
                    self._complete(head, body)
        finally:
            self._reading.release()

    def _child_ended(self) -> None:
        """The child closed its end: fail what is pending, and what comes."""
        try:
            code: int | None = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        with self._lock:
            self._ended = MasterUnavailable(f"the push process ended (exit code {code})")
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(self._ended)

    def _complete(self, head: dict[str, Any], body: bytes) -> None:
        with self._lock:
            self._retries = max(self._retries, head["retries"])
            if "id" not in head:  # the child retried: its count, while the request goes on
                return
            future = self._pending.pop(head["id"])
        future.arrived_at = head.get("arrived_at")
        if "error" in head:
            future.set_exception(_ERRORS.get(head["error"], MasterUnavailable)(head["message"]))
            return
        try:
            reply = Reply(head["status"], {k.lower(): v for k, v in head["headers"]}, body)
            if reply.status_code >= 400:  # the error it means (Conflict, MasterRejected, ...)
                check(httpx.Response(reply.status_code, headers=head["headers"], content=body))
            future.set_result(future.convert(reply))
        except Exception as exc:  # for the caller
            future.set_exception(exc)

    def close(self) -> None:
        """End the child (what it still sends is dropped) and fail what is pending."""
        with self._lock, suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        with self._reading:
            if self._ended is None:
                self._child_ended()


# -- the child -------------------------------------------------------------------------------------


def _serve() -> None:
    frames, stdin = Frames(), sys.stdin.fileno()
    out = os.dup(sys.stdout.fileno())  # the replies' pipe; print() and the like go to stderr
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    write_lock, stop = threading.Lock(), threading.Event()
    transport: Transport | None = None
    pool: ThreadPoolExecutor | None = None

    def send(head: dict[str, Any], body: bytes) -> None:
        assert transport is not None
        reply: dict[str, Any] = {"id": head["id"]}
        content = b""
        direct = {"content": body, "headers": dict(head["headers"]), "timeout": head["timeout"]}
        try:
            response = transport.request(head["method"], head["path"], direct, checked=False)
        except Stopped as exc:
            reply.update(error="stopped", message=str(exc))
        except ProtocolError as exc:  # a reply past A3C_MAX_BODY_BYTES
            reply.update(error="protocol", message=str(exc))
        except MasterUnavailable as exc:
            reply.update(error="unavailable", message=str(exc))
        except Exception as exc:  # anything else fails this request, not the process
            reply.update(error="unavailable", message=f"{type(exc).__name__}: {exc}")
        else:
            reply.update(status=response.status_code, headers=response.headers.multi_items())
            content = response.content
        reply["retries"] = transport.retries
        reply["arrived_at"] = time.monotonic()
        with write_lock:
            write_frame(out, reply, content)

    def retried(count: int) -> None:
        with write_lock:
            write_frame(out, {"retries": count})

    while data := os.read(stdin, 1 << 20):
        for head, body in frames.feed(data):
            if "options" in head:
                options = dict(head["options"])
                logs.configure(options.pop("log_level"), options.pop("log_format"))
                events = logs.Events(
                    logging.getLogger("a3c.worker"),
                    options.pop("run_id"),
                    options.pop("worker_id"),
                )
                transport = Transport(**options, stop=stop, events=events)
                transport.on_retry = retried
                pool = ThreadPoolExecutor(head["threads"], thread_name_prefix="a3c-push")
            elif "stop" in head:
                stop.set()
            else:
                assert pool is not None
                pool.submit(send, head, body)
    # The worker closed the pipe (or is gone): nothing waits for what is still on the wire.
    os._exit(0)


if __name__ == "__main__":
    _serve()
