"""The tests' service launcher: uvicorn processes forked from one process that has imported the
heavy libraries once (a zygote, as Android starts its apps), instead of each importing them again.

A master or worker started from nothing spends about 2 s of CPU before it answers, most of it
importing torch, numpy, FastAPI and uvicorn; the suite starts about 50 of them on 2 cores. Forked
from the zygote, a service imports only this project's modules, and then runs exactly as
`python -m uvicorn ARGS` does: as `__main__`, with its own environment, working folder, session and
log, ending with uvicorn's own exit code or signal.

`launch` is `ServiceProcess.launch` for the whole session (tests/conftest.py). It falls back to
the plain launcher (a new interpreter) where the zygote could not give the process what a new
interpreter would: a wrapper command, or an environment that differs in what an interpreter or the
preloaded libraries read as they start (`STARTUP_PREFIXES`). Scripts the tests run as commands
(`a3c-train`, `bench.py`) start their services the plain way, so that path is run too.

The zygote is a child of the test process, which reads each forked service's exit from it (the
service is the zygote's child, not ours); it ends when the test process closes its input.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import BinaryIO

PRELOADED = ("torch", "numpy", "gymnasium", "fastapi", "uvicorn", "httpx")
# Environment variables the interpreter or the preloaded libraries read as they load (or as
# OpenMP and CUDA start): a service whose value differs from the zygote's is started plainly.
STARTUP_PREFIXES = ("PYTHON", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_", "CUDA",
                    "LD_", "MALLOC")


# -- the zygote's side -------------------------------------------------------------------------


def _send(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def serve() -> dict:
    """Import PRELOADED, then fork a child for each request (a JSON line on stdin) and report
    its pid, and later its exit code, as JSON lines on stdout. Returns only in a child, with
    its request; exits when stdin closes."""
    for name in PRELOADED:
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    pending = b""
    _send({"ready": os.getpid()})
    while True:
        for key, _ in selector.select():
            if key.fd == wake_r:
                os.read(wake_r, 4096)
                continue
            data = os.read(0, 1 << 16)
            if not data:
                os._exit(0)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    return request
                _send({"pid": pid})
        _reap()


def run_service(request: dict) -> None:
    """In a forked child: become `python -m <module> ARGS` in the request's folder, session,
    environment and log, as subprocess.Popen with start_new_session would start it."""
    os.setsid()
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # as `python -m` puts the folder it runs in
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    env = request["env"]
    ours = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    added = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours]
    sys.path[1:1] = added  # where a new interpreter puts PYTHONPATH: after the script's folder
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


# -- the test process's side ---------------------------------------------------------------------


class ForkedService:
    """What ServiceProcess reads of a Popen, for a process the zygote forked."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exits.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._zygote.changed:
            if not self._zygote.changed.wait_for(lambda: self.poll() is not None, timeout):
                raise subprocess.TimeoutExpired(["uvicorn", f"pid {self.pid}"], timeout or 0)
        assert self.returncode is not None
        return self.returncode


class Zygote:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = dict(os.environ)
        self.exits: dict[int, int] = {}
        self.changed = threading.Condition()
        self._started: list[int] = []
        self._asking = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, __file__], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self.proc.stdout is not None
        self._lines = self.proc.stdout
        ready = json.loads(self._lines.readline() or b"{}")
        assert "ready" in ready, f"the zygote did not start: {ready}"
        threading.Thread(target=self._read, name="zygote-exits", daemon=True).start()

    def _read(self) -> None:
        for line in self._lines:
            message = json.loads(line)
            with self.changed:
                if "exit" in message:
                    self.exits[message["exit"]] = message["code"]
                else:
                    self._started.append(message["pid"])
                self.changed.notify_all()

    def serves(self, cmd: list[str], env: dict[str, str]) -> bool:
        """Whether a forked child would get what a new interpreter running `cmd` in `env` gets."""
        if cmd[:2] != [sys.executable, "-m"]:
            return False  # a wrapper command (a network namespace, a CPU set)
        changed = {key for key in self.env.keys() | env.keys()
                   if key.startswith(STARTUP_PREFIXES) and self.env.get(key) != env.get(key)}
        # Folders added in front of PYTHONPATH's: the child puts them on sys.path itself.
        if env.get("PYTHONPATH", "").endswith(self.env.get("PYTHONPATH", "")):
            changed.discard("PYTHONPATH")
        return not changed

    def launch(self, cmd: list[str], env: dict[str, str], log: BinaryIO) -> ForkedService:
        request = {"module": cmd[2], "args": cmd[3:], "env": env, "cwd": str(self.root),
                   "log": os.path.abspath(log.name)}  # the child opens it from ROOT
        assert self.proc.stdin is not None
        with self._asking, self.changed:
            seen = len(self._started)
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            if not self.changed.wait_for(lambda: len(self._started) > seen, 60):
                raise RuntimeError("the zygote forked nothing in 60 s")
            return ForkedService(self, self._started[seen])

    def close(self) -> None:
        """Close its input: it exits (the services it forked run on until ended by their pids)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


if __name__ == "__main__":
    run_service(serve())
