"""The push process: a worker's gradient pushes leave its process.

A worker that sends its pushes from threads of its own pays for them in its training: httpx and h11
are Python, about 0.6 ms of CPU a push, and each wake-up of a sender thread takes the GIL from the
rollout's torch calls. On this machine a rollout and its gradients took 4.7 to 5.6 ms with a sender
thread against 3.5 to 4.0 ms with no pushes at all. So the worker hands each push to a child
process (`python -m a3c_http.pushproc`, which imports httpx and a3c_http.transport, not torch) and
goes on: its training thread only writes the request into a pipe, and one reader thread takes
the replies out of the other.

The pipes carry frames (a3c_http/frames.py): 8 bytes (the lengths of a JSON head and of a body,
little-endian uint32), the head, the body. To the child: first `{"options": {...}, "threads": n}`
(a3c_http.transport's `Transport` arguments, the log settings and ids), then requests `{"id",
"method", "path", "headers", "timeout"}` with their bodies, and `{"stop": true}` when the worker is
told to stop (a request waiting for its reply or to be retried ends with Stopped). From the child:
`{"id", "status", "headers", "retries"}` with the reply's body, or `{"id", "error", "message",
"retries"}` when the request failed for good, and `{"retries"}` at each retry (the worker's /status
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
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx

from a3c_http import logs
from a3c_http.frames import Frames, write_frame
from a3c_http.transport import A3CError, MasterUnavailable, ProtocolError, Stopped, Transport

_ERRORS: dict[str, type[A3CError]] = {
    "unavailable": MasterUnavailable,
    "stopped": Stopped,
    "protocol": ProtocolError,
}
# How often the reader thread looks at the stop event while no reply comes.
_STOP_POLL_S = 0.1


class PushProcess:
    """The worker's side: starts the child, sends it requests, completes their futures."""

    def __init__(self, options: dict[str, Any], threads: int, stop: threading.Event) -> None:
        """`options`: `Transport`'s arguments (base_url, token, timeout_s, retry_deadline_s,
        backoff_s, max_backoff_s, max_reply_bytes, proxy_from_env) with log_level, log_format,
        run_id and worker_id; `threads`: requests the child sends at once; `stop`: the worker's
        stop event."""
        root = str(Path(__file__).resolve().parent.parent)  # this a3c_http, not another one
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "a3c_http.pushproc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
            bufsize=0,
        )
        self._in = self.proc.stdin.fileno()
        self._stop = stop
        self._lock = threading.Lock()  # the pending futures, and one writer at a time
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count(1)
        self._ended: A3CError | None = None
        self.retries = 0  # the child's retries so far
        write_frame(self._in, {"options": options, "threads": max(1, threads)})
        self._reader = threading.Thread(target=self._read, name="a3c-push-reader", daemon=True)
        self._reader.start()

    def submit(
        self, method: str, path: str, headers: dict[str, str], content: bytes, timeout: float
    ) -> Future:
        """Send one request; its future gets the reply (4xx included, for the caller to judge)
        or the error it failed with for good (MasterUnavailable, Stopped, ProtocolError)."""
        future: Future = Future()
        head = {"method": method, "path": path, "headers": list(headers.items())}
        with self._lock:
            if self._ended is not None:
                future.set_exception(self._ended)
                return future
            call_id = next(self._ids)
            self._pending[call_id] = future
            try:
                write_frame(self._in, {**head, "id": call_id, "timeout": timeout}, content)
            except OSError as exc:  # the child is gone: the reader fails what is pending
                self._pending.pop(call_id, None)
                future.set_exception(MasterUnavailable(f"the push process is gone: {exc}"))
        return future

    def _read(self) -> None:
        out, frames, stop_sent = self.proc.stdout.fileno(), Frames(), False
        while True:
            ready, _, _ = select.select([out], [], [], _STOP_POLL_S)
            if self._stop.is_set() and not stop_sent:
                stop_sent = True
                with self._lock, suppress(OSError):
                    write_frame(self._in, {"stop": True})
            if not ready:
                continue
            data = os.read(out, 1 << 20)
            if not data:
                break
            for head, body in frames.feed(data):
                self._complete(head, body)
        code = self.proc.wait()
        with self._lock:
            self._ended = MasterUnavailable(f"the push process ended (exit code {code})")
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(self._ended)

    def _complete(self, head: dict[str, Any], body: bytes) -> None:
        with self._lock:
            self.retries = max(self.retries, head["retries"])
            if "id" not in head:  # the child retried: its count, while the request goes on
                return
            future = self._pending.pop(head["id"])
        if "error" in head:
            future.set_exception(_ERRORS.get(head["error"], MasterUnavailable)(head["message"]))
        else:
            future.set_result(httpx.Response(head["status"], headers=head["headers"], content=body))

    def close(self) -> None:
        """End the child (what it still sends is dropped) and fail what is pending."""
        with self._lock, suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._reader.join(5)


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
