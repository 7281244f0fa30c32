"""A run of a master as the Python API holds it (`Run`, which `train` returns,
a3c_http/api/training.py): its status, history, folder and policy, following it until it ends,
stopping it, and ending the processes it started here."""

from __future__ import annotations

import contextlib
import time
import warnings
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from a3c_http.api.errors import TrainError
from a3c_http.api.policy import Policy, load_policy, policy_of
from a3c_http.cli.progress import RECONNECT_S, MasterLost, outliving, progress_line, read_status
from a3c_http.envs.make import allow_modules
from a3c_http.local.cluster import LocalCluster
from a3c_http.store.runstore import RunStore

__all__ = ["History", "Progress", "Run"]

# The finish reason of a run whose every worker left (master/run/ledger.py).
NO_WORKER_LEFT = "no worker is running any more"
PROGRESS_EVERY_S = 5.0
POLL_S = 0.5

# True: a3c-train's progress line every 5 s on stdout; False: silence; a function: called with
# every status the run's follower reads (about twice a second).
Progress = bool | Callable[[dict[str, Any]], None]


@dataclass
class History:
    """A run's history: its episodes (`global_episode`, `worker_id`, `reward`, `length`, `time`)
    and the evaluations of its global weights (`evaluation`, `model_version`, `elapsed_s`,
    `global_steps`, `mean_return`, ...), oldest first."""

    episodes: list[dict[str, Any]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def returns(self) -> list[float]:
        """Each episode's return, in order: what a learning curve plots."""
        return [float(e["reward"]) for e in self.episodes]


def _end(cluster: LocalCluster | None, http: httpx.Client) -> None:
    """End what a run started here: the run (so its folder is left finished) and its processes;
    its client. Also when the interpreter exits (a `weakref.finalize`)."""
    if cluster is not None:
        if cluster.master.running():
            with contextlib.suppress(httpx.HTTPError):
                http.post("/stop", json={}, timeout=10)
        cluster.close()
    http.close()


class Run:
    """One run of a master: started by `train`, followed and ended from here.

    `id`: the run id; `master_url`; `ends`: how the run ends (a sentence, as POST /train said
    it); `workers`: each worker's start (`worker_id`, `url`, `started`, `error`); `local`:
    whether the master and workers are processes this run started (ended with the run, by
    their pids; also at the interpreter's exit); `attached`: a run started elsewhere that this
    only follows (`a3c_http.attach`), which nothing here stops but `stop()`. Used as a context
    manager, leaving the block ends the run if it still runs (unless attached), and those
    processes."""

    def __init__(
        self,
        http: httpx.Client,
        url: str,
        data: dict[str, Any],
        modules: Iterable[str] = (),
        progress: Progress = True,
        cluster: LocalCluster | None = None,
        attached: bool = False,
    ) -> None:
        self.id: str = data["run_id"]
        self.master_url = url
        self.ends: str | None = data.get("ends")
        self.workers: list[dict[str, Any]] = list(data.get("workers", []))
        self.local = cluster is not None
        self.attached = attached
        self.result: dict[str, Any] | None = None  # the last status once the run ended
        self._http = http
        self._cluster = cluster
        self._modules = tuple(modules)
        self._progress = progress
        self._last: dict[str, Any] | None = None
        self._closed = False
        self._warned: set[tuple[Any, Any]] = set()
        self._folder = cluster.run_dir.resolve() if cluster is not None else None
        self._finalizer = weakref.finalize(self, _end, cluster, http)
        self._say(f"{'following run' if attached else 'run'} {self.id} "
                  f"{'on' if attached else 'started on'} {url}")  # fmt: skip
        if self.ends:
            self._say(f"it {self.ends}")
        if self._folder is not None:
            self._say(f"run folder {self._folder}")

    # -- what the run is --------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The master's GET /status, once the local processes ended the last one read of this
        run (`result`). `status()["run_id"]` is another id once the master runs another run."""
        if self._closed or (self.result is not None and self.local):
            return dict(self.result or self._last or {})
        status = self._call("GET", "/status").json()
        if status.get("run_id") == self.id:
            self._last = status
        return status

    @property
    def solved(self) -> bool:
        """Whether the run reached its target (its target_return)."""
        status = self.result or self.status()
        return status.get("run_id") == self.id and bool(status.get("solved"))

    @property
    def folder(self) -> Path:
        """The run folder: here for a local run; for a master elsewhere the path on its host, as
        its /status says (a run it has archived since: `archive/<id>` below it)."""
        if self._folder is not None:
            return self._folder
        status = self.status()
        if not status.get("run_dir"):
            raise TrainError(
                f"the master at {self.master_url} does not say where its run folder is"
            )
        folder = Path(status["run_dir"])
        return folder if status.get("run_id") == self.id else folder / "archive" / self.id

    def history(self) -> History:
        """The run's episodes and evaluations so far (GET /history, page by page; once the local
        processes ended, from the run folder)."""
        if self._ended_here():
            store = RunStore(self.folder)
            return History(store.read_episodes(), store.read_evaluations())
        history, since, evaluations_since = History(), 0, 0
        while True:
            params = {"since": since, "evaluations_since": evaluations_since, "limit": 10_000}
            page = self._call("GET", "/history", params=params).json()
            if page["run_id"] != self.id:
                raise TrainError(
                    f"run {self.id} is no longer the master's run (it runs {page['run_id']}); "
                    f"its history is in {self.folder} on the master's host"
                )
            history.episodes += page["episodes"]
            history.evaluations += page["evaluations"]
            since, evaluations_since = page["next"], page["evaluations_next"]
            if not page["more"]:
                return history

    def policy(self) -> Policy:
        """The run's policy as it is now (a3c_http/api/policy.py): a local run's from its folder
        (the last saved weights), a remote one's from its master (GET /global_model_weights).
        The environment's module must be importable here."""
        if self.local:
            return load_policy(self.folder, self._modules)
        allow_modules(self._modules)
        before = self.status()
        reply = self._call("GET", "/global_model_weights")
        after = self.status()
        if before.get("run_id") != self.id or after.get("run_id") != self.id:
            raise TrainError(
                f"run {self.id} is no longer the master's run: load its folder with "
                f"load_policy({str(self.folder)!r}) on the master's host"
            )
        return policy_of(after["config"], reply.content, self.id)

    # -- following and ending it ------------------------------------------------------------

    def wait(
        self, timeout_s: float | None = None, reconnect_s: float = RECONNECT_S
    ) -> dict[str, Any]:
        """Follow the run until it ends (progress as `train` was told), then end the processes
        it started here; its last status (`result`). TimeoutError after `timeout_s`, the run
        still running. A master elsewhere that cannot be reached (killed, restarted) is waited
        for up to `reconnect_s`, with a line saying so, and the run followed again once the
        master resumed it; TrainError after that. TrainError when the run ended because every
        worker left it with an error (their errors in the message)."""
        return self._follow(timeout_s, stop_at_cap=False, reconnect_s=reconnect_s)

    def stop(self) -> dict[str, Any]:
        """End the run (POST /stop, when it still runs) and the processes it started here; its
        last status."""
        try:
            if self.result is None and not self._closed:
                status = self.status()
                if status.get("run_id") == self.id and status.get("state") == "running":
                    self._call("POST", "/stop", json={})
                self.result = self._final()
        finally:
            self._end_here()  # also when the master cannot be reached any more
        return dict(self.result or {})

    def close(self) -> None:
        """End what this run started: the run itself if it still runs, the local processes, the
        client. Idempotent."""
        if self._closed:
            return
        if not self.attached:
            with contextlib.suppress(httpx.HTTPError, TrainError):
                self.stop()
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "local" if self.local else self.master_url
        state = "running" if self.result is None else self.result.get("finish_reason")
        return f"<Run {self.id} {where}: {state}>"

    def _follow(
        self, timeout_s: float | None, stop_at_cap: bool, reconnect_s: float = RECONNECT_S
    ) -> dict[str, Any]:
        """Follow the run until it ends; at `timeout_s`, stop it (`stop_at_cap`) or raise
        TimeoutError. A master elsewhere that cannot be reached is waited for up to
        `reconnect_s` (a local one, this run's process, does not come back). Anything else that
        interrupts it (Ctrl-C) stops the run first, unless it is attached."""
        if self.result is not None:
            return self._check_workers(self.result)
        started = shown = time.monotonic()
        capped = False
        reconnect_s = 0.0 if self.local else reconnect_s

        def status_outliving() -> dict[str, Any]:
            if self._closed or self.result is not None:
                return self.status()
            try:
                status = outliving(
                    lambda: read_status(self._http), self.master_url, reconnect_s, self._say
                )
            except (httpx.HTTPError, MasterLost) as exc:
                raise TrainError(f"cannot follow the master at {self.master_url}: {exc}") from None
            if status.get("run_id") == self.id:
                self._last = status
            return status

        try:
            previous = status = status_outliving()
            while status.get("run_id") == self.id and status.get("state") == "running":
                if not capped and timeout_s is not None and time.monotonic() - started > timeout_s:
                    if not stop_at_cap:
                        raise TimeoutError(f"run {self.id} still runs after {timeout_s:g} s")
                    self._say(f"time cap of {timeout_s:g} s reached: stopping the run")
                    self._call("POST", "/stop", json={})
                    capped = True
                time.sleep(POLL_S)
                status = status_outliving()
                self._warn_failed(status)
                if callable(self._progress):
                    self._progress(status)
                elif self._progress and time.monotonic() - shown >= PROGRESS_EVERY_S:
                    self._say(progress_line(status, previous))
                    previous, shown = status, time.monotonic()
            self.result = self._final()
        except TimeoutError:
            raise
        except BaseException:
            if not self.attached:
                with contextlib.suppress(httpx.HTTPError, TrainError):
                    self.stop()
            raise
        self._end_here()
        return self._check_workers(self.result)

    def _call(self, method: str, path: str, **options: Any) -> httpx.Response:
        """A call to the master; TrainError (one line) when it cannot be reached or refuses."""
        try:
            reply = self._http.request(method, path, **options)
        except httpx.TransportError as exc:
            raise TrainError(f"cannot reach the master at {self.master_url}: {exc}") from None
        if reply.status_code >= 400:
            try:
                detail = reply.json().get("detail")
            except ValueError:
                detail = None
            raise TrainError(
                f"{method} {path} on {self.master_url} answered {reply.status_code}: "
                f"{detail or reply.text[:300]}"
            )
        return reply

    def _warn_failed(self, status: dict[str, Any]) -> None:
        """A warning for each worker that left the run with an error (once): one that joined
        by itself and cannot make the environment says so here."""
        if status.get("run_id") != self.id:
            return
        for worker in status.get("workers", []):
            key = (worker.get("worker_id"), worker.get("error"))
            if worker.get("error") and key not in self._warned:
                self._warned.add(key)
                warnings.warn(
                    f"worker {key[0]} ({worker.get('name') or worker.get('url')}) left run "
                    f"{self.id}: {key[1]}",
                    RuntimeWarning,
                    stacklevel=4,
                )

    def _final(self) -> dict[str, Any]:
        status = self.status()
        if status.get("run_id") != self.id:
            return {**(self._last or {}), "solved": False}
        self._say(f"run finished: {status.get('finish_reason')}")
        return status

    def _check_workers(self, status: dict[str, Any]) -> dict[str, Any]:
        failed = [w for w in status.get("workers", []) if w.get("error")]
        if status.get("finish_reason") == NO_WORKER_LEFT and failed and not status.get("solved"):
            why = "; ".join(f"{w['worker_id']}: {w['error']}" for w in failed)
            raise TrainError(f"run {self.id} ended: every worker left it ({why})", self)
        return dict(status)

    def _ended_here(self) -> bool:
        return self.local and (self._closed or not self._cluster.master.running())

    def _end_here(self) -> None:
        if self.local:
            self._finalizer()
            self._closed = True

    def _say(self, line: str) -> None:
        if self._progress is True:
            print(line, flush=True)
