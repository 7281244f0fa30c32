"""The run ledger: which run is on and how it goes, under one lock. It holds the run (id, config,
state, elapsed time), its statistics (episode and step counters, best score, moving average,
last-100 window, FIFO), its evaluations (master/background/evaluator.py), the worker registry
(master/run/registry.py) and the history rows not saved yet.

What workers report (episodes, their statistics, heartbeats) is folded in by `Reports`
(master/run/reports.py), methods of the ledger apart because they are an idea of their own.

A change that finishes the run raises `finished`, which the facade (master/state.py) takes with
`take_finished()` after the lock is released, to save at once.

Only workers in the registry take part: a message from an unknown id is refused (409, told to stop),
and what a worker reports must be plausible (master/learning/admission.py, else 422); a refused
message is not a sign of life.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Literal

from a3c_http.config.training import TrainConfig
from master.errors import StateConflict
from master.learning.admission import RunLimits
from master.run.events import RunEvents
from master.run.original_counters import OriginalCounters
from master.run.records import Evaluations, Stats, WorkerRecord, solved_by
from master.run.registry import DEFAULT_MAX_WORKERS, Registry
from master.run.reports import Reports

RunState = Literal["idle", "running", "finished"]
# How often a worker with no run to join asks again (the `retry_s` of POST /join's reply), and
# how long after its last ask /status still lists it as waiting.
JOIN_RETRY_S = 2.0
JOIN_SEEN_S = 5 * JOIN_RETRY_S


class RunLedger(Reports):
    def __init__(self, queue_max: int, max_workers: int = DEFAULT_MAX_WORKERS) -> None:
        self.lock = threading.RLock()
        self.queue_max = queue_max
        self.max_workers = max_workers
        self.run_id: str | None = None
        self.run_state: RunState = "idle"
        self.finish_reason: str | None = None
        self.config: TrainConfig | None = None
        self.limits: RunLimits | None = None  # what the run's reports may claim
        self._elapsed_before = 0.0  # seconds run before this process (resume)
        self._running_since: float | None = None  # monotonic
        self.stats = Stats()
        self.evals = Evaluations()
        self.events = RunEvents()  # logged by the facade (master/state.py) after the lock
        self.workers = Registry(self.events, max_workers=max_workers)
        self.unsaved_rows: list[tuple] = []
        # The reply to each worker's last counted episode report, for its retries.
        self._episode_replies: dict[str, tuple[int, dict[str, Any]]] = {}
        self._finished = False
        # A run begun without a worker list waits for workers that join (POST /join): it does not
        # finish when none is left, as one whose workers the master started does.
        self.waits_for_workers = False
        # Workers that asked to join while no run was running: name -> when they last asked (wall
        # clock), shown in /status; they get the next run by asking again.
        self.waiting: dict[str, float] = {}
        self.original = OriginalCounters(self)  # the original design's counter endpoints

    # -- the run ---------------------------------------------------------------------------------

    def start_run(self, config: TrainConfig, worker_urls: list[str]) -> list[str]:
        """A new run with fresh counters; the workers the master is about to start are registered
        as `starting` in the same step, so the run is never seen running with nobody to run it.
        Returns the worker ids. Raises StateConflict while a run is running."""
        with self.lock:
            self.refuse_while_running()
            limits = RunLimits.of(config)
            self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
            self.config, self.limits = config, limits
            self.run_state = "running"
            self.finish_reason = None
            self._elapsed_before = 0.0
            self._running_since = time.monotonic()
            self.stats = Stats()
            self.evals = Evaluations()
            self.events.run_started(self.run_id, config, len(worker_urls))
            self.workers = Registry.launching(
                worker_urls, config, self.events, self.max_workers
            )
            self.waits_for_workers = not worker_urls
            self.unsaved_rows = []
            self._episode_replies = {}
            return list(self.workers.records)

    def refuse_while_running(self) -> None:
        """StateConflict while a run is running: a new one cannot begin."""
        with self.lock:
            if self.run_state == "running":
                raise StateConflict(f"run {self.run_id} is running: POST /stop it first")

    def finish(self, reason: str) -> bool:
        """End the running run (idempotent); True when this call ended it."""
        with self.lock:
            if self.run_state != "running":
                return False
            self._elapsed_before = self.elapsed_s()
            self._running_since = None
            self.run_state = "finished"
            self.finish_reason = reason
            self._finished = True
            self.events.run_finished(reason, self.stats, self.env_steps(), self._elapsed_before)
            return True

    def take_finished(self) -> bool:
        """True once after a change finished the run (the caller saves it)."""
        with self.lock:
            finished, self._finished = self._finished, False
            return finished

    def elapsed_s(self) -> float:
        with self.lock:
            running = time.monotonic() - self._running_since if self._running_since else 0.0
            return self._elapsed_before + running

    def check_same_run(self, run_id: str | None) -> None:
        """Refuse messages that name another run than the current one (a late worker of an
        earlier run). Messages without a run id (curl, the original design's clients) belong to the
        current run."""
        if run_id is not None and run_id != self.run_id:
            raise StateConflict(
                f"run {run_id} is over; the current run is {self.run_id}", stop=True
            )

    def admit_update(
        self, worker_id: str, run_id: str | None
    ) -> tuple[StateConflict | None, TrainConfig, RunLimits]:
        """Before gradients or weights are applied: raise for no run, another run or a worker
        that is not registered; for a finished run, return the refusal, which the parameter
        server raises unless the request is a retry of one taken before the finish. Also returns
        the run's config and limits. The worker is not touched: a push counts as a sign of life
        once its body was found valid (`report_rollout`, `touch_worker`)."""
        with self.lock:
            if self.run_state == "idle" or self.config is None or self.limits is None:
                raise StateConflict("no run has started: POST /train first", stop=True)
            self.check_same_run(run_id)
            self.workers.require(worker_id)
            refusal = None
            if self.run_state != "running":
                refusal = StateConflict(
                    f"run {self.run_id} is finished ({self.finish_reason})", stop=True
                )
            return refusal, self.config, self.limits

    def touch_worker(self, worker_id: str) -> None:
        """A registered worker's valid message (its weights): it is alive."""
        with self.lock:
            self._touch(worker_id)

    def round_expectation(self) -> tuple[set[str], bool]:
        """Whom a sync round waits for: the workers `running` (one still starting has not pulled
        the weights yet; one lost, done or failed will not send), and whether the run runs."""
        with self.lock:
            return self.workers.running(), self.run_state == "running"

    def should_stop(self, run_id: str | None = None) -> bool:
        with self.lock:
            return self.run_state != "running" or (run_id is not None and run_id != self.run_id)

    def env_steps(self) -> int:
        """Steps of reported episodes (`global_steps`) plus those of episodes still going on, as
        the workers' heartbeats last told them: what `max_steps` counts."""
        with self.lock:
            return self.stats.global_steps + self.workers.steps_in_progress()

    def solved(self) -> bool:
        """The mean return of the last 100 episodes (100 episodes needed), or with
        `solved_on=eval` that of the latest evaluation, reached the target. A finished run stays
        as it finished: the late episodes it still takes cannot unsolve it."""
        with self.lock:
            if self.run_state == "finished":
                return (self.finish_reason or "").startswith("solved:")
            return solved_by(self.config, self.stats, self.evals) is not None

    def _finish_if_done(self) -> None:
        cfg, stats = self.config, self.stats
        if cfg is None or self.run_state != "running":
            return
        criterion = solved_by(cfg, stats, self.evals)
        if criterion is not None:
            self.events.solved(criterion)
            self.finish(f"solved: {criterion}")
        elif cfg.max_episodes is not None and stats.global_episode >= cfg.max_episodes:
            self.finish(f"max_episodes={cfg.max_episodes} reached")
        elif cfg.max_steps is not None and self.env_steps() >= cfg.max_steps:
            self.finish(f"max_steps={cfg.max_steps} reached")

    # -- the registry ----------------------------------------------------------------------------

    def _touch(self, worker_id: str, url: str | None = None) -> WorkerRecord:
        return self.workers.touch(worker_id, self.run_state == "running", url)

    def worker_started(self, worker_id: str, url: str | None, run_id: str | None = None) -> None:
        """Register a worker as running (an explicit registration counts in any state)."""
        with self.lock:
            self.check_same_run(run_id)
            self.workers.register(worker_id, url, self.run_state == "running")

    def join(
        self,
        name: str,
        url: str | None,
        run_id: str | None = None,
        worker_id: str | None = None,
    ) -> dict[str, Any] | None:
        """A worker that joins by itself: its id, the run's id and config, and its exploration
        settings, or None while no run is running (it asks again). `run_id`/`worker_id`: the run
        it trained in before and its id there; the same run takes it back under that id."""
        with self.lock:
            # While the master still waits for the workers it starts to accept, a worker that is
            # one of them (listed in workers.txt, and also given A3C_MASTER_URL) must not join
            # under a second id: the joiners wait for the launch to end.
            launching = any(r.launching for r in self.workers.records.values())
            if self.run_state != "running" or self.config is None or launching:
                if len(self.waiting) < self.max_workers or name in self.waiting:
                    self.waiting[name] = time.time()
                return None
            self.waiting.pop(name, None)
            same = run_id == self.run_id
            record = self.workers.join(self.config, name, url, worker_id if same else None)
            return {
                "run_id": self.run_id,
                "worker_id": record.worker_id,
                "config": self.config.model_dump(),
                "exploration": dict(record.exploration or {}),
            }

    def waiting_workers(self, within_s: float) -> list[str]:
        """The workers that asked to join, with no run to join, in the last `within_s` s."""
        with self.lock:
            since = time.time() - within_s
            self.waiting = {n: t for n, t in self.waiting.items() if t >= since}
            return sorted(self.waiting)

    def worker_done(self, worker_id: str, error: str | None, run_id: str | None = None) -> str:
        with self.lock:
            self.check_same_run(run_id)
            state = self.workers.end(worker_id, error, self.run_state == "running")
            self._finish_if_no_worker_left()
            return state

    def worker_accepted(self, worker_id: str) -> None:
        """The worker accepted POST /start_worker: its silence counts from now."""
        with self.lock:
            record = self.workers.get(worker_id)
            if record is not None:
                record.launching = False
                if record.state == "starting":
                    record.last_seen = time.time()

    def exploration_of(self, worker_id: str) -> dict[str, float] | None:
        """The exploration settings the master derived for a worker it starts."""
        with self.lock:
            record = self.workers.get(worker_id)
            if record is None or record.exploration is None:
                return None
            return dict(record.exploration)

    def mark_failed(self, worker_id: str, error: str) -> None:
        with self.lock:
            self.workers.mark_failed(worker_id, error)

    def count_duplicate(self, worker_id: str) -> None:
        with self.lock:
            record = self.workers.get(worker_id)
            if record is not None:
                record.duplicates += 1

    def check_liveness(self) -> None:
        """Mark silent workers lost, also after the end of a run (a worker that never said it
        stopped must not look active for ever); finish a run that nobody runs any more."""
        with self.lock:
            if self.config is not None:
                self.workers.mark_silent_lost(self.config)
                self._finish_if_no_worker_left()

    def _finish_if_no_worker_left(self) -> None:
        if not self.waits_for_workers and self.workers.active() == 0:
            self.finish("no worker is running any more")

    def active_workers(self) -> int:
        with self.lock:
            return self.workers.active()

    def workers_public(self) -> list[dict[str, Any]]:
        with self.lock:
            return self.workers.public()

    # -- statistics ------------------------------------------------------------------------------

    def record_evaluation(
        self, run_id: str, taken: dict[str, Any], result: dict[str, Any] | None, error: str | None
    ) -> bool:
        """Fold in the evaluation (`result`, or the `error` it failed with) of the weights taken
        from run `run_id` at `taken` (model_version, elapsed_s, global_steps); one of an earlier
        run is dropped. Kept in any state of the run, like a late episode. True when kept."""
        with self.lock:
            if run_id != self.run_id:
                return False
            self.events.evaluation(taken, result, error)
            if result is None:
                self.evals.error = error
            else:
                self.evals.add(taken, result)
                self._finish_if_done()
            return True

    def status(self) -> dict[str, Any]:
        with self.lock:
            stats = self.stats
            return {
                "state": self.run_state,
                "run_id": self.run_id,
                "finish_reason": self.finish_reason,
                "waits_for_workers": self.waits_for_workers,
                "waiting_workers": self.waiting_workers(JOIN_SEEN_S),
                "env_id": self.config.env_id if self.config else None,
                "global_episode": stats.global_episode,
                "global_steps": stats.global_steps,
                "env_steps": self.env_steps(),
                "best_score": stats.best_score,
                "moving_average": stats.moving_average,
                "mean_return_100": stats.mean_return_100(),
                "solved": self.solved(),
                "queue_length": len(stats.queue),
                "queue_dropped": stats.queue_dropped,
                "elapsed_s": round(self.elapsed_s(), 3),
                "config": self.config.model_dump() if self.config else None,
                "workers": self.workers_public(),
                **self.evals.public(),
            }

    # -- persistence (master/persistence/saver.py)
    # -----------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a save writes of the ledger, but the history rows and the FIFO's entries."""
        with self.lock:
            return {
                "run_id": self.run_id,
                "run_state": self.run_state,
                "finish_reason": self.finish_reason,
                "stats": self.stats.to_json(),
                "evaluations": self.evals.to_json(),
                "workers": self.workers.to_json(),
                "waits_for_workers": self.waits_for_workers,
            }

    def rows_saved(self, last_episode: int | None, last_evaluation: int | None = None) -> None:
        """The history rows up to these numbers are on disk."""
        with self.lock:
            if last_episode is not None:
                self.unsaved_rows = [r for r in self.unsaved_rows if r[0] > last_episode]
            if last_evaluation is not None:
                unsaved = self.evals.unsaved
                self.evals.unsaved = [r for r in unsaved if r[0] > last_evaluation]

    def restore(
        self,
        state: dict[str, Any],
        elapsed_s: float,
        config: TrainConfig | None,
        queue: list[tuple[int, float]],
    ) -> None:
        with self.lock:
            self.run_id = state["run_id"]
            self.run_state = state["run_state"]
            self.finish_reason = state.get("finish_reason")
            self.config = config
            self.limits = RunLimits.of(config) if config is not None else None
            self._elapsed_before = elapsed_s
            self._running_since = time.monotonic() if self.run_state == "running" else None
            self.stats = Stats.from_json(state["stats"], queue)
            self.evals = Evaluations.from_json(state.get("evaluations", {}))
            self.workers = Registry.from_json(
                state.get("workers", []), self.events, self.max_workers
            )
            self.waits_for_workers = bool(state.get("waits_for_workers", False))
