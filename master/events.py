"""What the master logs (a3c_http/logs.py, logger `a3c.master`): one line per event of a run, and
a progress line every A3C_LOG_PROGRESS_S while a run runs.

The events happen under the run ledger's lock (master/ledger.py, master/registry.py), where no
I/O belongs: they are appended to `RunEvents` there and written by the facade (master/state.py)
once the lock is released (`flush`). Each keeps the id of the run it happened in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from a3c_http.logs import Pace, emit

if TYPE_CHECKING:
    from a3c_http.config import TrainConfig
    from master.records import Stats, WorkerRecord

logger = logging.getLogger("a3c.master")
INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR


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
            sync_mode=c.sync_mode,
            num_envs=c.num_envs,
            hidden_sizes=c.hidden_sizes,
            lr=c.lr,
            target_return=c.target_return,
            max_steps=c.max_steps,
            max_episodes=c.max_episodes,
            seed=c.seed,
        )

    def run_resumed(self, run_id: str, state: str, stats: Stats, elapsed_s: float) -> None:
        """A master started on a run folder took up its run (if it holds one)."""
        self.run_id = run_id
        if run_id is None:
            return
        self.add(
            INFO,
            "run_resumed",
            "run restored from the run folder",
            state=state,
            episodes=stats.global_episode,
            best_score=stats.best_score,
            elapsed_s=round(elapsed_s, 1),
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

    # -- the workers (master/registry.py) --------------------------------------------------------

    def worker_joined(self, record: WorkerRecord) -> None:
        self.add(INFO, "worker_joined", "worker joined", record.worker_id, url=record.url)

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
        self.pace = Pace(interval_s, clock)
        self._last: tuple[str, int] | None = None  # the run and env steps of the last line

    def tick(self, status: Callable[[], dict[str, Any]]) -> None:
        """Called often (the housekeeping thread's tick); `status` only when a line is due."""
        seconds = self.pace.due()
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
            "workers_running": sum(w["state"] == "running" for w in workers),
            "workers": len(workers),
        }
        emit(logger, INFO, "progress", "progress", s["run_id"], None, fields)
