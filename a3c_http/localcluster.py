"""Starting and ending uvicorn processes of this project on this host, for the quickstart, the
benchmarks and the tests, so all of them run the services exactly as a user does.

- `ServiceProcess`: one `uvicorn master.app:app` or `worker.app:app` on host:port, its output in a
  log file; start, wait until healthy, signal, kill, stop (SIGTERM, then SIGKILL), restart.
- `LocalCluster`: a master and workers; starts what is not running, starts runs, waits for a run to
  end, and ends every process. A worker serves run after run, so one cluster can serve many.
- `StandInWorker`: an in-process HTTP server that answers `POST /start_worker` like a worker and
  then does nothing, so that a master's run stays `running` while the caller plays the worker.
- `wait_for`: poll a condition until it holds or a deadline passes (never a bare sleep).

Every process is ended by its own pid, never by name.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


def wait_for(
    condition: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.1
) -> T:
    """Call `condition` until it returns something truthy, and return that; raise TimeoutError
    naming `what` (and the last value) after `timeout_s`. An `httpx.TransportError` raised by
    `condition` (a service not up yet, or restarting) counts as "not yet"."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            last = condition()
        except httpx.TransportError as exc:
            last = exc
        else:
            if last:
                return last  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            shown = repr(last)[:500]
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}; last: {shown}")
        time.sleep(interval_s)  # the polling interval, not a synchronisation


class ServiceProcess:
    """One `uvicorn <app>` process on host:port, its output in a log file.

    `env` is added to this process's environment (which `start` reads each time, so a restart can
    change it). `wrapper`, when given, is prepended to the command, e.g. `["ip", "netns", "exec",
    "ns1"]` to run the service in a network namespace. It must exec the command (not fork it), so
    that the pid this class signals stays the uvicorn process's.
    """

    def __init__(
        self,
        app: str,
        port: int,
        log_path: Path,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        token: str | None = None,
        wrapper: list[str] | None = None,
    ) -> None:
        self.app = app
        self.host = host
        self.wrapper = list(wrapper or [])
        self.port = port
        self.log_path = Path(log_path)
        self.token = token
        self.env = {**os.environ, **(env or {})}
        if token:
            self.env["A3C_TOKEN"] = token
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> ServiceProcess:
        assert not self.running(), f"{self.app} on port {self.port} is already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        log.write(f"\n===== {self.app} on {self.url}\n".encode())
        log.flush()
        cmd = [
            *self.wrapper,
            sys.executable,
            "-m",
            "uvicorn",
            self.app,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
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

    def healthy(self) -> bool:
        """True once GET /healthz answers 200; raises RuntimeError if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.app} on port {self.port} exited with code {self.proc.returncode}; "
                f"see {self.log_path}:\n{self.log_tail()}"
            )
        return httpx.get(f"{self.url}/healthz", timeout=2.0, trust_env=False).status_code == 200

    def wait_healthy(self, timeout_s: float = 60.0) -> ServiceProcess:
        wait_for(self.healthy, timeout_s, f"{self.app} on port {self.port} to be healthy")
        return self

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill(self) -> int | None:
        """SIGKILL (no shutdown of any kind) and reap. Returns the exit code."""
        if self.proc is None:
            return None
        self.signal(signal.SIGKILL)
        return self.proc.wait(timeout=30)

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM, wait up to `grace_s`, then SIGKILL. Returns the exit code: uvicorn shuts down
        gracefully on SIGTERM and then re-raises it, so -SIGTERM (or 0) is a clean exit."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def restart(self, timeout_s: float = 60.0) -> ServiceProcess:
        """Stop (SIGTERM) if running, start again with the current port and env, wait healthy."""
        self.stop()
        return self.start().wait_healthy(timeout_s)


class LocalCluster:
    """A master and workers on this host, each its own uvicorn process.

    `workers` are the (host, port) of the workers to start, or (host, port, env) to give one worker
    environment variables of its own (on top of `env`, which every process gets). Without
    `workers_file` the master gets a file listing exactly those workers. `http` is a client that
    carries the token.
    """

    def __init__(
        self,
        run_dir: Path,
        logs: Path,
        workers: list[tuple[str, int] | tuple[str, int, dict[str, str]]],
        master_port: int | None = None,
        host: str = "127.0.0.1",
        token: str | None = None,
        env: dict[str, str] | None = None,
        workers_file: Path | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.token = token
        env = env or {}
        self.workers = []
        for w_host, port, *own in workers:
            self.workers.append(
                ServiceProcess(
                    "worker.app:app",
                    port,
                    logs / f"worker-{port}.log",
                    host=w_host,
                    env={**env, **(own[0] if own else {})},
                    token=token,
                )
            )
        if workers_file is None:
            workers_file = logs / "workers.txt"
            workers_file.parent.mkdir(parents=True, exist_ok=True)
            workers_file.write_text("".join(f"{w.host}:{w.port}\n" for w in self.workers))
        self.master = ServiceProcess(
            "master.app:app",
            master_port or free_port(host),
            logs / "master.log",
            host=host,
            token=token,
            env={
                **env,
                "A3C_RUN_DIR": str(self.run_dir.resolve()),
                "A3C_WORKERS_FILE": str(Path(workers_file).resolve()),
            },
        )
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(headers=headers, timeout=30, trust_env=False)

    @property
    def processes(self) -> list[ServiceProcess]:
        return [self.master, *self.workers]

    def busy_ports(self) -> list[str]:
        return [f"{p.host}:{p.port}" for p in self.processes if port_in_use(p.host, p.port)]

    def start(self, timeout_s: float = 60.0) -> LocalCluster:
        """Start every process that is not running (all of them at first; after a test killed
        some, those), and wait until all are healthy."""
        for p in self.processes:
            if not p.running():
                p.start()
        for p in self.processes:
            p.wait_healthy(timeout_s)
        return self

    def train(self, **body: object) -> httpx.Response:
        """POST /train with `body`: config fields, and optionally "workers" and "master_url"."""
        return self.http.post(f"{self.master.url}/train", json=body)

    def status(self) -> dict:
        reply = self.http.get(f"{self.master.url}/status")
        reply.raise_for_status()
        return reply.json()

    def worker_status(self, worker: ServiceProcess) -> dict:
        reply = self.http.get(f"{worker.url}/status")
        reply.raise_for_status()
        return reply.json()

    def wait_finished(self, timeout_s: float = 120.0, interval_s: float = 0.1) -> dict:
        """The master's status once its run is no longer running."""
        return wait_for(
            lambda: (s := self.status())["state"] != "running" and s,
            timeout_s,
            "the run to end",
            interval_s,
        )

    def wait_workers_settled(
        self, workers: list[ServiceProcess] | None = None, timeout_s: float = 60.0
    ) -> tuple[dict, list[dict]]:
        """Once the run has ended: wait until each of `workers` (default: all that are running)
        has left its run (`done`, `failed` or `idle`), and until the master's registry shows
        `done` for each of them that is done with the master's current run (a worker says so
        before it tells the master). Returns (master status, worker statuses): what the workers
        that are done counted is then what the master counted."""
        workers = [w for w in (workers or self.workers) if w.running()]

        def left() -> list[dict] | None:
            statuses = [self.worker_status(w) for w in workers]
            busy = [s for s in statuses if s["state"] in ("running", "stopping")]
            return None if busy else statuses

        statuses = wait_for(left, timeout_s, "the workers to leave the run")

        def agreed() -> dict | None:
            status = self.status()
            if status["state"] == "running":
                return None
            states = {w["worker_id"]: w["state"] for w in status["workers"]}
            done = [
                w for w in statuses if w["state"] == "done" and w["run_id"] == status["run_id"]
            ]
            return status if all(states.get(w["worker_id"]) == "done" for w in done) else None

        return wait_for(agreed, timeout_s, "the master to see the workers done"), statuses

    def stop_run(self, timeout_s: float = 60.0) -> tuple[dict, list[dict]]:
        """POST /stop (a no-op when nothing runs) and wait until the workers have left the run."""
        reply = self.http.post(f"{self.master.url}/stop")
        reply.raise_for_status()
        return self.wait_workers_settled(timeout_s=timeout_s)

    def close(self) -> None:
        """End every process this cluster started (workers first, so the master sees them go)."""
        self.http.close()
        for p in [*self.workers, self.master]:
            p.stop()


class StandInWorker:
    """An HTTP server in this process that plays a worker host which never trains: it answers 202
    to `POST /start_worker` (and to any other POST), 200 to GET, and keeps every request it got
    (`requests`: method, path, lower-case headers, JSON body or None). With `token`, it refuses
    requests without `Authorization: Bearer <token>` with 401, as a worker with that token does,
    and sends that token to the master. A master's run whose only workers are stand-ins stays
    `running` (they stay `starting`), so the caller can play the worker's part itself and control
    every counter.

    `start_delay_s` makes it a slow host: its answer to `POST /start_worker` takes that long. With
    `beat_s` it then acts alive without training: `POST /worker_started` to the master it was
    given, and `POST /heartbeat` every `beat_s` (at most `max_beats`, until closed); `events`
    keeps (monotonic time, what, HTTP status) of those."""

    def __init__(
        self,
        token: str | None = None,
        host: str = "127.0.0.1",
        start_delay_s: float = 0.0,
        beat_s: float | None = None,
        max_beats: int = 600,
    ) -> None:
        self.token = token
        self.start_delay_s = start_delay_s
        self.beat_s = beat_s
        self.max_beats = max_beats
        self.requests: list[dict[str, Any]] = []
        self.events: list[tuple[float, str, int]] = []
        self._closing = threading.Event()
        self._beaters: list[threading.Thread] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self, code: int) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                headers = {k.lower(): v for k, v in self.headers.items()}
                with owner._lock:
                    owner.requests.append(
                        {"method": self.command, "path": self.path, "headers": headers,
                         "body": body}
                    )
                start = self.command == "POST" and self.path.startswith("/start_worker")
                if owner.token and headers.get("authorization") != f"Bearer {owner.token}":
                    code, reply, start = 401, {"detail": "missing or wrong token"}, False
                elif self.command == "GET":
                    reply = {"status": "ok", "state": "idle"}
                else:
                    reply = {"data": {"state": "running"}}
                if start:
                    # a slow host: the answer itself takes this long (not a synchronisation)
                    owner._closing.wait(owner.start_delay_s)
                data = json.dumps(reply).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()
                if start and owner.beat_s is not None and isinstance(body, dict):
                    owner._record("answered /start_worker", code)
                    beater = threading.Thread(target=owner._live, args=(body,), daemon=True)
                    owner._beaters.append(beater)
                    beater.start()

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._handle(200)

            def do_POST(self) -> None:  # noqa: N802
                self._handle(202)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def _record(self, what: str, code: int) -> None:
        with self._lock:
            self.events.append((time.monotonic(), what, code))

    def _live(self, start: dict[str, Any]) -> None:
        """Register with the master of `start` and heart-beat until closed (a live worker's
        messages, without its training)."""
        assert self.beat_s is not None
        master = str(start.get("master_url", "")).rstrip("/")
        worker_id = start.get("worker_id")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        with httpx.Client(base_url=master, headers=headers, timeout=10, trust_env=False) as c:
            try:
                reply = c.post(
                    "/worker_started",
                    json={"worker_id": worker_id, "url": self.url, "run_id": start.get("run_id")},
                )
                self._record("worker_started", reply.status_code)
                for _ in range(self.max_beats):
                    if self._closing.wait(self.beat_s):  # the beat's period
                        return
                    reply = c.post("/heartbeat", json={"worker_id": worker_id})
                    self._record(f"heartbeat {reply.text[:80]}", reply.status_code)
            except httpx.HTTPError as exc:
                self._record(f"error {exc!r}", 0)

    def starts(self) -> list[dict[str, Any]]:
        """The `POST /start_worker` requests received so far."""
        with self._lock:
            return [r for r in self.requests if r["path"].startswith("/start_worker")]

    def close(self) -> None:
        self._closing.set()
        for beater in self._beaters:
            beater.join(timeout=15)
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> StandInWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
