"""What the master logs (a3c_http/server/logs.py, logger `a3c.master`): one line per event of a run,
and a progress line every A3C_LOG_PROGRESS_S while a run runs.

The events happen under the run ledger's lock (master/run/ledger.py, master/run/registry.py), where
no I/O belongs: they are appended to `RunEvents` there and written by the facade (master/state.py)
once the lock is released (`flush`). Each keeps the id of the run it happened in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from a3c_http.config.ending import how_it_ends
from a3c_http.server.logs import ProgressClock, emit

if TYPE_CHECKING:
    from a3c_http.config.training import TrainConfig
    from master.run.records import Stats, WorkerRecord

logger = logging.getLogger("a3c.master")
DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR


@dataclass(frozen=True)
class Event:
    level: int
    event: str
    message: str
    run_id: str | None
    worker_id: str | None
    fields: dict[str, Any]


class RunEvents:
    """The events not written yet, and what each event says."""

    def __init__(self) -> None:
        self.run_id: str | None = None  # the run the next events belong to
        self._pending: list[Event] = []
        self._lock = threading.Lock()  # the list, between the ledger's lock and a flush
        self._writing = threading.Lock()  # one flush at a time: the lines keep their order

    def add(self, level: int, event: str, message: str, worker_id: str | None = None, **fields):
        with self._lock:
            self._pending.append(Event(level, event, message, self.run_id, worker_id, fields))

    def flush(self) -> None:
        """Write the events added so far (called with no lock of the state held); returns once
        they are written, also those another thread took first."""
        if not self._pending and not self._writing.locked():  # the cheap look of every request
            return
        with self._writing:
            with self._lock:
                events, self._pending = self._pending, []
            for e in events:
                emit(logger, e.level, e.event, e.message, e.run_id, e.worker_id, e.fields)

    # -- the run ---------------------------------------------------------------------------------

    def run_started(self, run_id: str, config: TrainConfig, workers: int) -> None:
        self.run_id = run_id
        c = config
        self.add(
            INFO,
            "run_started",
            "run started",
            env_id=c.env_id,
            workers=workers,
            algo=c.algo,
            num_envs=c.num_envs,
            hidden_sizes=c.hidden_sizes,
            lr=c.lr,
            target_return=c.target_return,
            max_steps=c.max_steps,
            max_episodes=c.max_episodes,
            seed=c.seed,
            ends=how_it_ends(c),
        )

    def run_resumed(
        self,
        run_id: str | None,
        state: str,
        stats: Stats,
        elapsed_s: float,
        model_version: int,
        skipped: int,
    ) -> None:
        """A master started on a run folder took up its run (if it holds one); `skipped`: the
        model versions it jumped after a crash (master/persistence/resume.py)."""
        self.run_id = run_id
        if run_id is None:
            return
        message = (
            f"resumed run {run_id} after a crash: model versions continue at {model_version}, "
            "past any version handed out since the last save"
            if skipped
            else "run restored from the run folder"
        )
        self.add(
            INFO,
            "run_resumed",
            message,
            state=state,
            episodes=stats.global_episode,
            best_score=stats.best_score,
            elapsed_s=round(elapsed_s, 1),
            model_version=model_version,
            versions_skipped=skipped,
        )

    def run_finished(self, reason: str, stats: Stats, env_steps: int, elapsed_s: float) -> None:
        self.add(
            INFO,
            "run_finished",
            "run finished",
            reason=reason,
            episodes=stats.global_episode,
            env_steps=env_steps,
            best_score=stats.best_score,
            mean_return_100=stats.mean_return_100(),
            elapsed_s=round(elapsed_s, 1),
        )

    def solved(self, criterion: str) -> None:
        self.add(INFO, "solved", "solved", criterion=criterion)

    def best_score(self, worker_id: str, best: float, episode: int) -> None:
        """Raised by an episode of `worker_id`, the run's `episode`-th."""
        self.add(
            INFO, "best_score", "best score raised", worker_id, best_score=best, episode=episode
        )

    def evaluation(
        self, taken: dict[str, Any], result: dict[str, Any] | None, error: str | None
    ) -> None:
        if result is None:
            self.add(
                WARNING,
                "evaluation_failed",
                "evaluation failed",
                model_version=taken["model_version"],
                error=error,
            )
            return
        self.add(
            INFO,
            "evaluation",
            "evaluation",
            mean_return=result["mean_return"],
            std_return=result["std_return"],
            episodes=result["episodes"],
            model_version=taken["model_version"],
        )

    # -- the workers (master/run/registry.py)
    # --------------------------------------------------------

    def worker_joined(self, record: WorkerRecord) -> None:
        self.add(
            INFO,
            "worker_joined",
            "worker joined",
            record.worker_id,
            url=record.url,
            origin=record.origin,
            name=record.name,
        )

    def worker_lost(self, record: WorkerRecord) -> None:
        self.add(WARNING, "worker_lost", "worker lost", record.worker_id, reason=record.error)

    def worker_back(self, record: WorkerRecord) -> None:
        self.add(INFO, "worker_back", "worker came back", record.worker_id)

    def worker_ended(self, record: WorkerRecord) -> None:
        """`done`, or `failed` with its error."""
        if record.state == "failed":
            self.add(ERROR, "worker_failed", "worker failed", record.worker_id, error=record.error)
        else:
            self.add(
                INFO,
                "worker_done",
                "worker done",
                record.worker_id,
                episodes=record.episodes,
                steps=record.steps,
            )


class ProgressLog:
    """The master's progress line: every `interval_s` seconds while a run runs, its episodes,
    env steps and env steps per second since the last line, the mean return of the last 100,
    the best score, the model version and the workers running."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.progress_clock = ProgressClock(interval_s, clock)
        self._last: tuple[str, int] | None = None  # the run and env steps of the last line

    def tick(self, status: Callable[[], dict[str, Any]]) -> None:
        """Called often (the housekeeping thread's tick); `status` only when a line is due."""
        seconds = self.progress_clock.due()
        if seconds is None:
            return
        s = status()
        if s["state"] != "running":
            return
        steps = s["env_steps"]
        if self._last is not None and self._last[0] == s["run_id"]:
            rate = (steps - self._last[1]) / seconds
        else:  # the run's first line: its rate so far
            rate = steps / s["elapsed_s"] if s["elapsed_s"] > 0 else 0.0
        self._last = (s["run_id"], steps)
        workers = s["workers"]
        fields = {
            "episodes": s["global_episode"],
            "env_steps": steps,
            "steps_per_s": round(rate, 1),
            "mean_return_100": s["mean_return_100"],
            "best_score": s["best_score"],
            "model_version": s["model_version"],
            "updates_applied": s["updates_applied"],
            # Refusals are left out of the access log (a3c_http/server/service.py QuietAccessLog),
            # as the pushes computed before a restart are; this line sums them up.
            "updates_rejected": s["updates_rejected"],
            "rejected_by": {k: v for k, v in s["updates_rejected_by"].items() if v},
            "workers_running": sum(w["state"] == "running" for w in workers),
            "workers": len(workers),
        }
        emit(logger, INFO, "progress", "progress", s["run_id"], None, fields)


def lock_file_restored(folder: Path) -> None:
    """The owner put back the folder's lock file, which a hand had removed."""
    emit(
        logger,
        WARNING,
        "lock_file_restored",
        "the run folder's lock file was removed: put back (this master still owns the folder)",
        None,
        None,
        {"folder": str(folder)},
    )


def resume_failed(message: str, run_id: str | None, file: str) -> None:
    """The master found a run it cannot resume (master/persistence/resume.py): `message` says which
    file, what is wrong and what to do."""
    emit(logger, ERROR, "resume_failed", message, run_id, None, {"file": file})


class Failures:
    """A task that is retried until it works (a save of the run folder, a housekeeping chore):
    its first failure in a row is logged as an error (at `level`: a warning for an optional task
    such as logging to Weights & Biases) with what went wrong, each further one at DEBUG, and the
    first success after them at INFO with how long it failed (events `<event>_failed`,
    `<event>_recovered`). `public()` is what /status shows. The caller serialises `failed` and
    `succeeded`; `public` may be read from any thread."""

    def __init__(
        self, what: str, event: str, traceback: bool = False, level: int = ERROR, **fields: Any
    ) -> None:
        self.what = what
        self.event = event
        self.level = level
        self.traceback = traceback  # the first failure's: for tasks that are not expected to fail
        self.fields = fields
        # (error, since: wall clock, since: monotonic, failures), replaced whole, so a reader
        # never sees half of an update.
        self._now: tuple[str, float, float, int] | None = None

    def failed(self, exc: BaseException, run_id: str | None = None) -> None:
        error = f"{type(exc).__name__}: {exc}"
        now = self._now
        if now is None:
            self._now = (error, time.time(), time.monotonic(), 1)
            emit(
                logger,
                self.level,
                f"{self.event}_failed",
                f"{self.what} failed; retrying at every tick",
                run_id,
                None,
                {**self.fields, "error": error},
                exc_info=exc if self.traceback else False,
            )
        else:
            self._now = (error, now[1], now[2], now[3] + 1)
            fields = {**self.fields, "error": error, "failures": now[3] + 1}
            emit(
                logger,
                DEBUG,
                f"{self.event}_failed",
                f"{self.what} failed again",
                run_id,
                None,
                fields,
            )

    def succeeded(self, run_id: str | None = None) -> None:
        now = self._now
        if now is None:  # the cheap look of every success
            return
        self._now = None
        fields = {
            **self.fields,
            "failed_for_s": round(time.monotonic() - now[2], 1),
            "failures": now[3],
        }
        emit(
            logger,
            INFO,
            f"{self.event}_recovered",
            f"{self.what} works again",
            run_id,
            None,
            fields,
        )

    def public(self) -> dict[str, Any] | None:
        """`{"error", "since" (unix time of the first failure in a row), "failures"}`, or None
        while the task works."""
        now = self._now
        if now is None:
            return None
        return {"error": now[0], "since": round(now[1], 3), "failures": now[3]}
