"""A worker that joins by itself: with A3C_MASTER_URL set, the worker asks the master for a run
(`POST /join`) from its start on, and again after each run and whenever its trainer gave up on a
master that went away. The master answers with the running run (its id, its config, and this
worker's id and exploration settings) or with none, and the worker asks again `retry_s` later.
It leaves on SIGTERM (its trainer says `POST /worker_done`) or by vanishing (the master marks it
lost after `heartbeat_timeout_s`).

After a restart of the master the worker's trainer goes on with the run the master resumed (its
calls are retried for A3C_MASTER_RETRY_S); past that, the trainer ends and the worker joins again
under the id it had, which the resumed run still holds.

A run this worker cannot train (its config does not validate here: most often an environment whose
module is not importable on this host) is reported to the master (`POST /worker_done` with the
reason, which /status shows as the worker's `error`), and the worker asks again only after
MAX_PAUSE_S, under the same id.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any, Protocol

from a3c_http.config.settings import WorkerSettings
from a3c_http.net.client import A3CError, MasterClient, MasterUnavailable, Unauthorized

log = logging.getLogger("a3c.worker")

# How long one ask may be retried before the loop notes the master unreachable and asks again;
# how long it waits after a trainer failed or the master refused the ask, at most.
ASK_DEADLINE_S = 10.0
MAX_PAUSE_S = 30.0


def default_name() -> str:
    """The host's name and the process id: unique on a host, and a pod's host name is the pod's
    name."""
    return f"{socket.gethostname()}:{os.getpid()}"


class CannotTrain(Exception):
    """The run a master gave cannot be trained by this worker; `str()` says why."""


class Slot(Protocol):
    """What the joiner needs of the worker's one training slot (worker/app.py WorkerService)."""

    settings: WorkerSettings
    token: str | None
    state: str
    master_gone: bool

    def busy(self) -> bool: ...

    def join(self, timeout: float) -> None: ...

    def take(self, run: dict[str, Any], master_url: str, own_url: str | None) -> bool: ...


class Joiner:
    """The loop that joins `service` (the worker's one training slot) to the runs of the master
    at `settings.master_url`."""

    def __init__(self, service: Slot) -> None:
        settings = service.settings
        assert settings.master_url is not None
        self.service = service
        self.master_url = settings.master_url.rstrip("/")
        self.name = settings.worker_name or default_name()
        self.url = settings.worker_url
        self._closing = threading.Event()
        self._client = MasterClient(
            self.master_url,
            service.token,
            retry_deadline_s=ASK_DEADLINE_S,
            stop=self._closing,
            max_reply_bytes=settings.max_body_bytes,
            proxy_from_env=settings.proxy_from_env,
        )
        self._thread = threading.Thread(target=self._loop, name="a3c-joiner", daemon=True)
        self.last: tuple[str | None, str | None] = (None, None)  # run id, worker id there
        self.refused = False  # the last run given could not be trained here

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop asking (the caller stops a run in progress)."""
        self._closing.set()
        self._thread.join(timeout=ASK_DEADLINE_S + 5)
        self._client.close()

    def _loop(self) -> None:
        pause = 0.0
        ours = False  # whether the slot runs, or ran last, a run this loop joined
        unreachable = False
        while not self._closing.wait(pause):
            pause = 0.0
            if self.service.busy():
                self.service.join(1.0)
                continue
            if ours:  # that run ended: join the next at once, unless the trainer failed here
                ours = False
                if self.service.state == "failed" and not self.service.master_gone:
                    pause = MAX_PAUSE_S  # an error of this host: not in a tight loop
                    continue
            try:
                reply = self._client.join(self.name, self.url, *self.last)
            except MasterUnavailable as exc:
                if not unreachable:
                    log.warning("cannot reach the master at %s to join: %s", self.master_url, exc)
                unreachable, pause = True, 2.0
                continue
            except (Unauthorized, A3CError) as exc:  # 401, 409 (its registry is full), 422
                if not self._closing.is_set():
                    log.error("the master at %s did not let this worker join: %s",
                              self.master_url, exc)
                pause = MAX_PAUSE_S
                continue
            unreachable = False
            run = reply.get("run")
            if run is None:
                pause = float(reply.get("retry_s") or 2.0)
            else:
                ours = self._train(run)
                if self.refused:  # an error of this host: told, and not in a tight loop
                    self.refused, pause = False, MAX_PAUSE_S

    def _train(self, run: dict[str, Any]) -> bool:
        """Start the trainer on the run the master gave; whether it started. One it cannot
        train is reported to the master, and the next ask waits (`self.refused`)."""
        try:
            started = self.service.take(run, self.master_url, self.url)
        except CannotTrain as exc:
            log.error("%s", exc)
            self.last = (run.get("run_id"), run.get("worker_id"))
            self.refused = True
            self._client.run_id = run.get("run_id")  # not a worker of another run the master began
            try:
                self._client.worker_done(run["worker_id"], str(exc))
            except (A3CError, KeyError):
                pass  # the master is gone, or the run is over: this asks again later anyway
            finally:
                self._client.run_id = None
            return False
        if not started:
            return False
        self.last = (run["run_id"], run["worker_id"])
        log.info("joined run %s of %s as %s", run["run_id"], self.master_url, run["worker_id"])
        return True
