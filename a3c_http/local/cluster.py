"""Starting and ending uvicorn processes of this project on this host, for the quickstart, the
benchmarks and the tests, so all of them run the services exactly as a user does.

- `ServiceProcess`: one `uvicorn master.app:app` or `worker.app:app` on host:port, its output in a
  log file; start, wait until healthy, signal, kill, stop (SIGTERM, then SIGKILL), restart.
- `LocalCluster`: a master and workers; starts what is not running, starts runs, waits for a run to
  end, and ends every process. A worker serves run after run, so one cluster can serve many.
- `StandInWorker` (a3c_http/testing/standin.py): a worker host that never trains, for runs whose
  worker the caller plays itself.
- `wait_for`: poll a condition until it holds or a deadline passes (never a bare sleep).

Every process is ended by its own pid, never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

import httpx

from a3c_http.net import tls

ROOT = Path(__file__).resolve().parents[2]
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


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name (which may hold spaces and
    parentheses: the fields follow the last ")"), from the state on; None where it cannot be
    read (another system, or the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system, every thread) process `pid` has used so far, from /proc
    (Linux); None where it cannot be read."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def with_descendants(pids: list[int]) -> list[int]:
    """`pids` and every process below them (a master's receivers, a worker's push process), from
    /proc."""
    children: dict[int, list[int]] = {}
    for path in Path("/proc").glob("[0-9]*"):
        fields = stat_fields(int(path.name))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(path.name))
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def cpu_of(pids: list[int]) -> dict[int, float]:
    """The CPU time of each of `pids` that still runs (`cpu_seconds`)."""
    seconds = {pid: cpu_seconds(pid) for pid in pids}
    return {pid: s for pid, s in seconds.items() if s is not None}


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float | None:
    """The CPU time the processes read in both `cpu_of`s used between them (one that ended
    between them is left out); None when /proc told nothing of any."""
    both = before.keys() & after.keys()
    return sum(after[pid] - before[pid] for pid in both) if both else None


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
    that the pid this class signals stays the uvicorn process's. `uvicorn_args` are appended to
    uvicorn's, e.g. `["--http", "h11"]`.
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
        uvicorn_args: list[str] | None = None,
    ) -> None:
        self.app = app
        self.host = host
        self.wrapper = list(wrapper or [])
        self.uvicorn_args = list(uvicorn_args or [])
        self.port = port
        self.log_path = Path(log_path)
        self.token = token
        self.env = {**os.environ, **(env or {})}
        if token:
            self.env["A3C_TOKEN"] = token
        self.proc: subprocess.Popen | None = None

    @property
    def tls(self) -> tls.TLS:
        """The TLS settings of its environment (a3c_http/net/tls.py): https with A3C_TLS_CERT."""
        return tls.from_environ(self.env)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls.serves else 'http'}://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> ServiceProcess:
        assert not self.running(), f"{self.app} on port {self.port} is already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        log.write(f"\n===== {self.app} on {self.url}\n".encode())
        log.flush()
        cmd = [*self.wrapper, sys.executable, "-m", "uvicorn", self.app, "--host", self.host,
               "--port", str(self.port), "--log-level", "warning", *self.tls.uvicorn_args(),
               *self.uvicorn_args]
        try:
            self.proc = self.launch(cmd, self.env, log)
        finally:
            log.close()
        return self

    @staticmethod
    def launch(cmd: list[str], env: dict[str, str], log: BinaryIO) -> subprocess.Popen:
        """Run `cmd` in ROOT with `env`, its output into `log`, in a session of its own (so a
        signal to its process group reaches nothing of ours): the one place a service process
        is made. A replacement (the tests' preloaded launcher) returns an object that answers
        Popen's `pid`, `poll`, `wait` and `returncode`."""
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def healthy(self) -> bool:
        """True once GET /healthz answers 200; raises RuntimeError if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.app} on port {self.port} exited with code {self.proc.returncode}; "
                f"see {self.log_path}:\n{self.log_tail()}"
            )
        verify = self.tls.client_context()
        reply = httpx.get(f"{self.url}/healthz", timeout=2.0, trust_env=False, verify=verify)
        return reply.status_code == 200

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

    def cpu_seconds(self) -> dict[int, float]:
        """The CPU time the process and the processes below it (a master's receivers) have used so
        far, by pid (`cpu_of`; `cpu_delta` of two of them is what they used in between)."""
        return cpu_of(with_descendants([self.pid])) if self.pid is not None else {}

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
            workers_file.write_text("".join(f"{w.url}\n" for w in self.workers))
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
        verify = self.master.tls.client_context()
        self.http = httpx.Client(headers=headers, timeout=30, trust_env=False, verify=verify)

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
        reply = self.http.post(f"{self.master.url}/stop", json={})
        reply.raise_for_status()
        return self.wait_workers_settled(timeout_s=timeout_s)

    def close(self) -> None:
        """End every process this cluster started (workers first, so the master sees them go)."""
        self.http.close()
        for p in [*self.workers, self.master]:
            p.stop()
