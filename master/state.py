"""ClusterState: the master's state, as three parts under a thin facade.

- `ledger` (master/run/ledger.py): the run, its statistics and the worker registry, one lock;
- `params` (master/learning/parameter_server.py): the parameter server (global network, optimizer,
  versions), one lock, so that episode reports never wait behind an optimizer step;
- `persister` (master/persistence/saver.py): the run folder, one mutex for snapshot, write and
  archive.

Lock order: `start_run`'s lock, then the learner's lifecycle lock
(master/learning/learner_process.py: starting or stopping the learner of a run that has one), then
the persister's mutex, then the ledger's lock, then the lock of the weights the learner shares (held
while it publishes them to the parameter server), then the parameter server's. A part never calls
another while it holds its own lock, so only these and the evaluator
(master/background/evaluator.py, taking the weights it plays) ever hold two. The learner's condition
(its queue's slots) is a leaf: nothing is called while it is held.
No file is written while the ledger's or the parameter server's lock is held.

The routes call the parts directly for what concerns one part only; the facade does what spans
them: starting a run, updates (the ledger admits, the parameter server applies), status, saving
at once whatever finished the run, and logging the run's events (master/run/events.py) once the
ledger's lock is released. In sync mode it also tells the parameter server when the workers a
round waits for are gone, so the round closes without them.

At start it takes up the run in its folder (master/persistence/resume.py), or starts idle with the
reason it cannot (`resume_error`). No save ever raises into a request: a failed one is recorded
(/status
`save_error`) and the housekeeping thread retries it.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import torch

from a3c_http.algos.base import Sends
from a3c_http.algos.exploration import check_actions
from a3c_http.algos.registry import algorithm_class, learns_from_experience, model_for
from a3c_http.config.settings import Settings
from a3c_http.config.training import TrainConfig
from a3c_http.optim.optimizers import learning_rate
from a3c_http.store.runstore import RunStore
from a3c_http.wire import tensors as wire
from master.background.evaluator import Evaluator
from master.errors import Invalid, StateConflict
from master.learner_runs import (
    LearnerRuns,
    check_learner_fits,
    rollout_expectation,
    rollout_report,
)
from master.learning.admission import RunLimits
from master.learning.learner_needs import resolve_device
from master.learning.learner_process import LearnerBusy, LearnerProcess, WouldWait
from master.learning.parameter_server import ParameterServer
from master.learning.rounds import Outcome
from master.persistence.resume import (
    VERSIONS_SKIPPED_AFTER_A_CRASH,
    CannotResume,
    resume,
    saved_config,
    versions_to_skip,
)
from master.persistence.saver import Persister
from master.run.events import lock_file_restored, resume_failed
from master.run.ledger import RunLedger
from master.shard_runs import ShardRuns

if TYPE_CHECKING:
    from master.api.schemas import RolloutReport
    from master.ingress.receivers import Receivers

__all__ = [
    "VERSIONS_SKIPPED_AFTER_A_CRASH",
    "ClusterState",
    "LearnerBusy",
    "WouldWait",
    "Sends",
    "StateConflict",
    "saved_config",
    "versions_to_skip",
]


class ModelTooLarge(ValueError):
    """The model of a config does not fit in a request body."""


class ClusterState(LearnerRuns, ShardRuns):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = RunStore.acquire(settings.run_dir)
        # Why the run in the folder could not be resumed (master/persistence/resume.py), until a new
        # run.
        self.receivers: Receivers | None = None  # master/ingress/receivers.py, started by the app
        self._starting = threading.Lock()  # held by start_run from its check to its learner
        self.resume_error: CannotResume | None = None
        self._new_parts()
        try:
            resumed = resume(self.store, self.ledger, self.params, time.time())
        except CannotResume as exc:
            resumed = None
            self._new_parts()  # idle, with nothing of the run that could not be taken up
            self.resume_error = exc
            self.persister.unresumable = exc.aside
            if exc.next_version is not None:  # a new run's versions go on after that run's
                self.params.version = exc.next_version
            resume_failed(str(exc), exc.run_id, str(exc.file))
        if resumed is not None:
            self.persister.restored(resumed.saved_at)
            self._start_learner(resumed=True)
            self._start_shards()
        # Started and closed by the app's lifespan (master/app.py).
        self.evaluator = Evaluator(self.ledger, self.params, self.record_evaluation)
        self.ledger.events.flush()  # the resume's line before any of its save's
        if resumed is not None and resumed.skipped:
            self.persist()  # the skipped versions are on disk before any is handed out

    def _new_parts(self) -> None:
        self.ledger = RunLedger(self.settings.queue_max, self.settings.max_workers)
        self.params = ParameterServer()
        self.persister = Persister(self.store, self.ledger, self.params)
        self.learner = LearnerProcess(
            self._publish, self._learner_failed, self.settings.persist_interval_s / 2
        )
        self._expected = {}  # what a rollout of the run holds (master/learner_runs.py)

    def close(self) -> None:
        """Stop the learner, if one runs, and give up the run folder (the caller saved what it
        wanted to keep)."""
        self.learner.stop()
        self.params.close_shards()
        self.store.close()

    def keep_folder(self) -> None:
        """Put back the folder's lock file if it was removed by hand (the housekeeping thread
        looks at every save's tick)."""
        if self.store.keep_lock():
            lock_file_restored(self.store.dir)

    # -- the run ---------------------------------------------------------------------------------

    def start_run(self, config: TrainConfig, worker_urls: list[str]) -> tuple[str, list[str]]:
        """Begin a new run with fresh weights and counters, the workers about to be started
        registered as `starting`; the previous run's files are archived. Returns the run id and
        the worker ids. Raises StateConflict while a run is running, and ModelTooLarge,
        ExplorationError, DeviceUnavailable or SharedMemoryShort for a config that does not fit
        this master (nothing is changed then)."""
        config = config.resolved()
        with torch.device("meta"):  # no memory, no init: only the sizes
            shapes = model_for(config)
        check_actions(config, shapes.discrete)
        self._check_fits(config, wire.Layout.of(shapes, config.wire_dtype).body_bytes)
        if learns_from_experience(config):
            resolve_device(config.device)  # DeviceUnavailable before anything changes
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)
            model = model_for(config)
        expected = None  # what its rollouts hold, for a run with a learner
        if learns_from_experience(config):
            expected = rollout_expectation(config, model)
            check_learner_fits(config, model, expected)  # SharedMemoryShort before any change

        def swap() -> tuple[str, list[str]]:
            # A run of this folder before (also one that could not be resumed, whose last
            # version `__init__` took): the new run's versions go on after its.
            earlier_run = self.ledger.run_id is not None or self.params.version > 0
            worker_ids = self.ledger.start_run(config, worker_urls)
            self.params.start_run(config, model, next_version=earlier_run)
            return self.ledger.run_id, worker_ids

        with self._starting:  # one at a time: a run that is running stays untouched
            self.ledger.refuse_while_running()
            self.learner.stop()  # an earlier run's, finished
            # An earlier run's shards (its last save gathered them): the new run's network is
            # not theirs, so nothing may gather from them into it.
            self.params.close_shards()
            started = self.persister.switch_run(swap)
            self.resume_error = None  # that run's files are moved aside (or will be, at next save)
            self._start_learner(expected=expected)
            self._start_shards()
        self.ledger.events.flush()
        return started

    def _check_fits(self, config: TrainConfig, size: int) -> None:
        """Weights and gradients larger than the body limit would be refused at every push."""
        limit = self.settings.max_body_bytes
        if size > limit:
            whole = config.wire_dtype == "float32"
            halve = ", wire_dtype bfloat16 (about half the bytes)" if whole else ""
            raise ModelTooLarge(
                f"hidden_sizes {config.hidden_sizes}: the weights of this model are {size} bytes "
                f"on the wire ({config.wire_dtype}), more than A3C_MAX_BODY_BYTES={limit}, so "
                "every push of its weights or gradients would be refused (413); use smaller "
                f"hidden_sizes{halve}, or raise A3C_MAX_BODY_BYTES on the master and every worker"
            )

    def finish(self, reason: str) -> bool:
        """End the running run (idempotent) and save it; workers learn it at their next
        exchange."""
        return self._after_change(self.ledger.finish(reason))

    def _after_change(self, result: Any) -> Any:
        """Save at once when the change that produced `result` finished the run (after closing
        a sync round that no running worker is left to complete; the housekeeping thread's
        liveness check comes here twice a second), and log the events of the change."""
        if self.params.round is not None:  # a cheap look first: check_round looks again
            self.params.check_round(*self.ledger.round_expectation())
        if self.ledger.take_finished():
            self.learner.stop()  # its last weights and optimizer state are in the save
            self.persist()
        self.ledger.events.flush()
        return result

    def check_liveness(self) -> None:
        self._after_change(self.ledger.check_liveness())

    def record_evaluation(
        self, run_id: str, taken: dict[str, Any], result: dict[str, Any] | None, error: str | None
    ) -> None:
        self._after_change(self.ledger.record_evaluation(run_id, taken, result, error))

    def worker_started(self, worker_id: str, url: str | None, run_id: str | None = None) -> None:
        self._after_change(self.ledger.worker_started(worker_id, url, run_id))

    def join(
        self, name: str, url: str | None, run_id: str | None, worker_id: str | None
    ) -> dict[str, Any] | None:
        return self._after_change(self.ledger.join(name, url, run_id, worker_id))

    def worker_done(self, worker_id: str, error: str | None, run_id: str | None = None) -> str:
        return self._after_change(self.ledger.worker_done(worker_id, error, run_id))

    def heartbeat(self, worker_id: str, stats: dict[str, Any], run_id: str | None = None) -> bool:
        return self._after_change(self.ledger.heartbeat(worker_id, stats, run_id))

    def report_episode(
        self,
        worker_id: str,
        reward: float,
        length: int,
        run_id: str | None = None,
        seq: int | None = None,
    ) -> dict[str, Any]:
        return self._after_change(
            self.ledger.report_episode(worker_id, reward, length, run_id, seq)
        )

    # -- updates ---------------------------------------------------------------------------------

    def apply_update(
        self,
        kind: Sends,
        worker_id: str,
        version: int,
        body: bytes,
        run_id: str | None = None,
        seq: int | None = None,
        loss: float | None = None,
        norm: float | None = None,
        wait: bool = True,
    ) -> tuple[Outcome, dict[str, Any]]:
        """Take one worker's push of `kind` (its route's: master/ingress/updates.py), computed
        or acted with the weights of `version`, numbered `seq` (a retry of one taken is answered,
        not taken again). Every kind is admitted alike, by the ledger (no run, another run, a
        worker that is not registered: StateConflict; a finished run: refused unless a retry),
        then must be what the run's algorithm's workers push (StateConflict naming the route
        they push to), then is taken by its plane: gradients (with the loss and the norm before
        clipping the worker reported) by the parameter server as the algorithm applies them,
        experience by the learner beside the master (master/learner_runs.py). The body's
        metadata may carry the rollout's finished episodes and the worker's statistics
        (master/api/schemas.py RolloutReport), counted first, whatever becomes of the update.
        Returns the outcome (master/learning/rounds.py `await_outcome`: the newest weights, or
        None for an experience push whose worker holds them; their version; whether the request
        was a retry) and the run's summary as `POST /episode` answers them. Refused with
        nothing taken: StateConflict (409: stale, an outlier, no running run, an unregistered
        worker), WireError or Invalid (422, and then nothing at all is counted and the worker is
        not taken to be alive), LearnerBusy (503, nothing counted). `wait` False (a push taken on
        the event loop): an experience push that would wait for the learner raises WouldWait,
        nothing taken."""
        refusal, config, limits = self.ledger.admit_update(worker_id, run_id)
        learner = learns_from_experience(config)
        if learner != (kind is Sends.EXPERIENCE):
            route = "/experience" if learner else "/gradients"
            raise StateConflict(
                f"algo {config.algo!r}: its workers push to POST {route} ("
                + ("rollouts for the learner beside the master" if learner else "gradients")
                + "); nothing taken"
            )
        if learner:
            return self._take_experience(
                worker_id, version, body, run_id, seq, refusal, config, wait
            )
        return self._take_gradients(
            worker_id, version, body, run_id, seq, loss, norm, refusal, config, limits
        )

    def _take_gradients(
        self,
        worker_id: str,
        version: int,
        body: bytes,
        run_id: str | None,
        seq: int | None,
        loss: float | None,
        norm: float | None,
        refusal: StateConflict | None,
        config: TrainConfig,
        limits: RunLimits,
    ) -> tuple[Outcome, dict[str, Any]]:
        """An admitted gradient push (`apply_update`): applied at once, or in sync mode added to
        the current round; the run's algorithm (a3c_http/algos/) decides what applying means."""
        vector, metadata = self.params.decode(body, gradients=True)
        report = rollout_report(metadata)
        update = self.params.checked_update(
            worker_id, version, vector, config, limits, seq, loss, norm
        )
        run_summary = self._count_rollout(worker_id, report, run_id, seq)
        self._schedule_learning_rate(config)
        outcome = algorithm_class(config).apply(
            self.params, update, config, refusal, self._round_expectation
        )
        if outcome.duplicate and not run_summary["duplicate"]:
            self.ledger.count_duplicate(worker_id)
        return outcome, run_summary

    def _count_rollout(
        self, worker_id: str, report: RolloutReport | None, run_id: str | None, seq: int | None
    ) -> dict[str, Any]:
        """A gradient push's rollout report (its finished episodes, the worker's statistics)
        counted by the ledger, whatever then becomes of the update; the run's summary. Invalid,
        counted as a refused update, for a report no rollout can make."""
        episodes, stats = (report.episodes, report.stats) if report else ([], None)
        try:
            return self._after_change(
                self.ledger.report_rollout(
                    worker_id, episodes, stats.model_dump() if stats else None, run_id, seq
                )
            )
        except Invalid:
            self.params.count_invalid()
            raise

    def _schedule_learning_rate(self, config: TrainConfig) -> None:
        if config.lr_schedule != "constant":  # a constant rate is the optimizer's own
            self.params.set_learning_rate(learning_rate(config, self.ledger.env_steps()))

    def _round_expectation(self) -> set[str]:
        """The running workers a sync round waits for."""
        expected, _ = self.ledger.round_expectation()
        return expected

    def put_weights(
        self,
        worker_id: str,
        body: bytes,
        temporary: bool,
        run_id: str | None = None,
        seq: int | None = None,
    ) -> tuple[int, bool]:
        """A worker's weights: its temporary slot, or (temporary=False) the new global weights.
        Returns the model version and whether this was a retry of weights already taken."""
        refusal, config, _ = self.ledger.admit_update(worker_id, run_id)
        if learns_from_experience(config) and not temporary:
            raise StateConflict(
                f"algo {config.algo!r}: the learner beside the master owns the global weights; "
                "nothing applied"
            )
        vector, _ = self.params.decode(body)
        version, duplicate = self.params.put_weights(worker_id, vector, temporary, seq, refusal)
        self.ledger.touch_worker(worker_id)
        if duplicate:
            self.ledger.count_duplicate(worker_id)
        return version, duplicate

    # -- status and persistence ------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        self.check_liveness()
        persister = self.persister
        return {
            **self.ledger.status(),
            **self.params.counters(),
            "save_error": persister.failures.public(),
            "last_saved_at": persister.last_saved_at,
            "resume_error": self.resume_error.public() if self.resume_error else None,
            "run_dir": str(self.store.dir.resolve()),
            "fronts": self.receivers.status() if self.receivers is not None else None,
            "learner": self._learner_status(),
            "shards": self.params.shards_status(),
        }

    def persist(self, force: bool = False, clean: bool = False, wait_s: float = -1) -> bool:
        """Save what changed (master/persistence/saver.py: a failure is recorded, never raised)."""
        return self.persister.save(force, clean, wait_s)
