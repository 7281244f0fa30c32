"""Helpers of the black-box reliability suite: real uvicorn processes on loopback ports.

Nothing here imports the project: the services are started as a user would start them, with
``python -m uvicorn master.app:app`` / ``worker.app:app`` and the environment variables of the
README, and spoken to over HTTP only.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
PYTHON = str(VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable))

STARTUP_TIMEOUT_S = 60.0
TERM_GRACE_S = 20.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(
    fn: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.1,
) -> Any:
    """Call ``fn`` until it returns something truthy; fail with ``what`` after ``timeout`` s.

    Exceptions raised by ``fn`` (a service not up yet) count as "not yet".
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}"
            )
        time.sleep(interval)


class Service:
    """One uvicorn process (master or worker) that the suite started and must end."""

    def __init__(
        self,
        app: str,
        env: dict[str, str],
        log_dir: Path,
        name: str,
        port: int | None = None,
    ) -> None:
        self.app = app
        self.name = name
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("A3C_")}
        base.setdefault("A3C_TORCH_THREADS", "1")
        base["PYTHONUNBUFFERED"] = "1"
        base.update(env)
        self.env = base
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def token(self) -> str | None:
        return self.env.get("A3C_TOKEN")

    def start(self) -> Service:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        log.write(f"\n===== start #{self.starts} of {self.app} on {self.url}\n".encode())
        log.flush()
        cmd = [PYTHON, "-m", "uvicorn", self.app, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        return self

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> Service:
        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited with {self.proc.returncode} at start:\n{self.log_tail()}"
                )
            r = httpx.get(self.url + "/healthz", timeout=2.0)
            return r.status_code == 200

        poll(up, timeout, f"{self.name} /healthz")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL this process (by its pid) and reap it."""
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self, grace: float = TERM_GRACE_S) -> int | None:
        """SIGTERM by pid, SIGKILL after ``grace`` s; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        return self.proc.returncode

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def client(self, token: str | None | bool = True, timeout: float = 30.0) -> httpx.Client:
        """An httpx client; ``token=True`` uses this service's own token (if any)."""
        if token is True:
            token = self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)


class Services:
    """Starts services and ends every one of them (by pid) at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.all: list[Service] = []

    def master(self, env: dict[str, str], name: str = "master", start: bool = True) -> Service:
        svc = Service("master.app:app", env, self.log_dir, name)
        self.all.append(svc)
        if start:
            svc.start()
        return svc

    def worker(self, env: dict[str, str] | None = None, name: str = "worker") -> Service:
        svc = Service("worker.app:app", env or {}, self.log_dir, name)
        self.all.append(svc)
        svc.start()
        return svc

    def close(self, grace: float = 10.0) -> None:
        """SIGTERM the workers (all at once), then the masters; SIGKILL whatever is still up
        ``grace`` s later. Workers go first so that they can still reach their master."""
        for group in (
            [s for s in self.all if s.app.startswith("worker")],
            [s for s in self.all if not s.app.startswith("worker")],
        ):
            live = [s for s in group if s.alive()]
            t0 = time.monotonic()
            for svc in live:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(svc.pid, signal.SIGTERM)
            for svc in live:
                assert svc.proc is not None
                try:
                    svc.proc.wait(timeout=max(0.1, grace - (time.monotonic() - t0)))
                except subprocess.TimeoutExpired:
                    os.kill(svc.pid, signal.SIGKILL)
                    svc.proc.wait(timeout=30)
                took = time.monotonic() - t0
                if took > 3.0:
                    print(
                        f"\n[bb-teardown] {svc.name} ended {took:.1f} s after SIGTERM "
                        f"(exit {svc.proc.returncode})",
                        flush=True,
                    )


class StubWorker:
    """A minimal in-process HTTP 'worker' that accepts ``POST /start_worker``.

    By default it does nothing else: it lets a master hold a run in state ``running`` without
    any real worker sending episodes, so that every counter of the run is under the test's
    control. With ``start_delay_s`` it answers ``/start_worker`` that much later (a slow host);
    with ``beat_s`` it then behaves like a live worker: ``POST /worker_started`` at once, then
    ``POST /heartbeat`` every ``beat_s`` (at most ``max_beats`` times, until closed).
    """

    def __init__(
        self, start_delay_s: float = 0.0, beat_s: float | None = None, max_beats: int = 120
    ) -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        self.events: list[tuple[float, str, int]] = []  # (monotonic time, what, HTTP status)
        self.start_delay_s = start_delay_s
        self.beat_s = beat_s
        self.max_beats = max_beats
        self.closing = threading.Event()
        self.beaters: list[threading.Thread] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _read(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                payload = self.rfile.read(length) if length else b""
                stub.requests.append((self.command, self.path, payload))
                return payload

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._read()
                if self.path == "/healthz":
                    self._answer(200, {"status": "ok"})
                else:
                    self._answer(200, {"state": "idle"})

            def do_POST(self) -> None:  # noqa: N802
                payload = self._read()
                if self.path != "/start_worker":
                    self._answer(202, {"data": {"accepted": True}})
                    return
                # a slow host: the answer itself takes this long (not a synchronisation)
                stub.closing.wait(stub.start_delay_s)
                self._answer(202, {"data": {"accepted": True}})
                stub.events.append((time.monotonic(), "answered /start_worker", 202))
                if stub.beat_s is not None:
                    body = json.loads(payload or b"{}")
                    t = threading.Thread(target=stub._live, args=(body,), daemon=True)
                    stub.beaters.append(t)
                    t.start()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _live(self, start: dict[str, Any]) -> None:
        master = str(start.get("master_url", "")).rstrip("/")
        wid = start.get("worker_id")
        assert self.beat_s is not None
        with httpx.Client(base_url=master, timeout=10) as c:
            try:
                r = c.post("/worker_started", json={"worker_id": wid, "url": self.url})
                self.events.append((time.monotonic(), "worker_started", r.status_code))
                for _ in range(self.max_beats):
                    if self.closing.wait(self.beat_s):
                        return
                    r = c.post("/heartbeat", json={"worker_id": wid})
                    self.events.append(
                        (time.monotonic(), f"heartbeat {r.text[:80]}", r.status_code)
                    )
            except httpx.HTTPError as exc:
                self.events.append((time.monotonic(), f"error {exc!r}", 0))

    def close(self) -> None:
        self.closing.set()
        for t in self.beaters:
            t.join(timeout=15)
        self.server.shutdown()
        self.server.server_close()


def safetensors_bytes(tensors: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    return save(tensors)


def load_safetensors(data: bytes) -> dict[str, Any]:
    from safetensors.torch import load

    return load(data)


def pickle_bytes(obj: Any) -> bytes:
    import pickle

    return pickle.dumps(obj)


def torch_save_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
