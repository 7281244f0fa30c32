"""Starting and ending uvicorn processes of this project on this host: used by the quickstart and
by the integration tests, so both run the services exactly as a user does.

Every process is ended by its own pid (SIGTERM, then SIGKILL after a grace period), never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


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


class ServiceProcess:
    """One `uvicorn <app>` process on host:port, its output in a log file.

    `wrapper`, when given, is prepended to the command, e.g. `["ip", "netns", "exec", "ns1"]` to
    run the service in a network namespace. It must exec the command (not fork it), so that the
    pid this class signals stays the uvicorn process's.
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

    def start(self) -> ServiceProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
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

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.app} on port {self.port} exited with code {self.proc.returncode}; "
                    f"see {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.app} on port {self.port} not healthy after {timeout_s:.0f} s")

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

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM, wait up to `grace_s`, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode


class LocalCluster:
    """A master and workers on this host, each its own uvicorn process. `workers` are the
    (host, port) of the workers to start; without `workers_file` the master gets a file listing
    exactly those."""

    def __init__(
        self,
        run_dir: Path,
        logs: Path,
        workers: list[tuple[str, int]],
        master_port: int | None = None,
        host: str = "127.0.0.1",
        token: str | None = None,
        env: dict[str, str] | None = None,
        workers_file: Path | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        env = env or {}
        self.workers = [
            ServiceProcess(
                "worker.app:app",
                port,
                logs / f"worker-{port}.log",
                host=w_host,
                env=env,
                token=token,
            )
            for w_host, port in workers
        ]
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
        self.http = httpx.Client(headers=headers, timeout=30)

    @property
    def processes(self) -> list[ServiceProcess]:
        return [self.master, *self.workers]

    def busy_ports(self) -> list[str]:
        return [f"{p.host}:{p.port}" for p in self.processes if port_in_use(p.host, p.port)]

    def start(self, timeout_s: float = 60.0) -> LocalCluster:
        for p in self.processes:
            p.start()
        for p in self.processes:
            p.wait_healthy(timeout_s)
        return self

    def train(self, **config: object) -> httpx.Response:
        return self.http.post(f"{self.master.url}/train", json=config)

    def status(self) -> dict:
        return self.http.get(f"{self.master.url}/status").json()

    def worker_status(self, worker: ServiceProcess) -> dict:
        return self.http.get(f"{worker.url}/status").json()

    def close(self) -> None:
        """End every process this cluster started (workers first, so the master sees them go)."""
        self.http.close()
        for p in [*self.workers, self.master]:
            p.stop()
