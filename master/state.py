"""ClusterState: every piece of shared state of the master, its locks and its persistence.

Two locks, so that episode reports never wait behind an optimizer step:

- `_model_lock` guards the global network, its optimizer, the model version and the temporary
  weight slots;
- `_lock` guards the run (id, config, state), the counters, best score, moving average, last-100
  window, FIFO, the registry and the history not yet written.

When both are needed, `_lock` is taken first. Persistence takes a snapshot under the locks and
writes it outside them (see `a3c_http.store`).

Retries are never counted twice. A worker numbers its episode reports, gradients and weights with
one rising sequence number (`X-A3C-Seq`) and a retry keeps the number of the first attempt. The
master remembers, per worker, the last number it counted: an episode under `_lock`, an update under
`_model_lock`, checked and recorded in the same critical section as the change itself. A retry of
a request already taken (its reply was lost) is answered without counting it again; a retry of a
refused request is judged again and refused again.
"""

from __future__ import annotations

import io
import threading
import time
import uuid
from dataclasses import asdict
from typing import Any, Literal

import torch

from a3c_http import wire
from a3c_http.config import Settings, TrainConfig
from a3c_http.model import ActorCritic, build_model
from a3c_http.store import RunStore, Snapshot
from master.records import ACTIVE, Stats, WorkerRecord

RunState = Literal["idle", "running", "finished"]
# A master that resumes a running run after a crash, not a clean shutdown, skips this many model
# versions: the versions it handed out after its last save (a few seconds of updates) named
# weights that are lost, and must never name other weights. Gradients computed on them are then
# far too stale (409: the worker pulls the weights), and an ETag cached from them never matches.
VERSIONS_SKIPPED_AFTER_A_CRASH = 1_000_000


class StateConflict(Exception):
    """The request does not fit the run's state (409). `stop` tells a worker to end."""

    def __init__(self, message: str, stop: bool = False) -> None:
        super().__init__(message)
        self.stop = stop


class ClusterState:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = RunStore(settings.run_dir)
        self._lock = threading.RLock()
        self._model_lock = threading.Lock()
        self._dirty = False

        self.run_id: str | None = None
        self.run_state: RunState = "idle"
        self.finish_reason: str | None = None
        self.config: TrainConfig | None = None
        self._elapsed_before = 0.0  # seconds run before this process (resume)
        self._running_since: float | None = None  # monotonic
        self.stats = Stats()
        self.workers: dict[str, WorkerRecord] = {}
        self._pending_rows: list[tuple] = []

        self.model: ActorCritic | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._spec: dict[str, tuple[int, ...]] = {}
        self.model_version = 0
        self.updates_applied = 0
        self.updates_rejected = 0
        self._encoded: tuple[int, bytes] | None = None
        self.temporary: dict[str, bytes] = {}
        # The last X-A3C-Seq of an update applied for each worker (guarded by _model_lock), and
        # the reply to each worker's last counted episode report (guarded by _lock).
        self._update_seq: dict[str, int] = {}
        self._episode_replies: dict[str, tuple[int, dict[str, Any]]] = {}

        if self._restore():
            self.persist()  # the skipped versions are on disk before any is handed out

    # -- run lifecycle -------------------------------------------------------------------------

    def start_run(self, config: TrainConfig, worker_urls: list[str]) -> tuple[str, list[str]]:
        """Begin a new run with fresh weights and counters; the previous run's files are archived.
        The workers the master is about to start are registered as `starting` in the same step, so
        the run is never seen running with nobody to run it. Returns the run id and the worker ids.
        Raises StateConflict while a run is running."""
        config = config.resolved()
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)
            model = build_model(config.env_id, config.env_kwargs, config.hidden_sizes)
        with self._lock, self._model_lock:
            if self.run_state == "running":
                raise StateConflict(f"run {self.run_id} is running: POST /stop it first")
            earlier_run = self.run_id is not None
            if earlier_run:
                self.store.archive(self.run_id)
            self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
            self.config = config
            self.run_state = "running"
            self.finish_reason = None
            self._elapsed_before = 0.0
            self._running_since = time.monotonic()
            self.stats = Stats()
            now = time.time()
            worker_ids = [f"w{i}" for i in range(1, len(worker_urls) + 1)]
            self.workers = {
                wid: WorkerRecord(wid, url, "starting", now, launching=True)
                for wid, url in zip(worker_ids, worker_urls, strict=True)
            }
            self._pending_rows = []
            self._set_model(model, optimizer_state=None)
            # Versions go on rising across the runs of a run folder, so a version (or an ETag a
            # client cached) from an earlier run never names the new run's weights.
            self.model_version += 1 if earlier_run else 0
            self.updates_applied = 0
            self.updates_rejected = 0
            self.temporary = {}
            self._update_seq = {}
            self._episode_replies = {}
            self._dirty = True
            run_id = self.run_id
        self.persist()
        return run_id, worker_ids

    def finish(self, reason: str) -> bool:
        """End the running run (idempotent) and persist it; workers learn it at their next
        exchange."""
        with self._lock:
            finished = self._finish_locked(reason)
        if finished:
            self.persist()
        return finished

    def _finish_locked(self, reason: str) -> bool:
        """The state change of `finish`, for callers that hold `_lock`; they persist after
        releasing it, so no file is written under the lock."""
        if self.run_state != "running":
            return False
        self._elapsed_before = self.elapsed_s()
        self._running_since = None
        self.run_state = "finished"
        self.finish_reason = reason
        self._dirty = True
        return True

    def elapsed_s(self) -> float:
        with self._lock:
            running = time.monotonic() - self._running_since if self._running_since else 0.0
            return self._elapsed_before + running

    def _check_same_run(self, run_id: str | None) -> None:
        """Refuse messages that name another run than the current one (a late worker of an
        earlier run). Messages without a run id (curl, the seed's clients) belong to the current
        run."""
        if run_id is not None and run_id != self.run_id:
            raise StateConflict(
                f"run {run_id} is over; the current run is {self.run_id}", stop=True
            )

    def _check_run(self, run_id: str | None) -> StateConflict | None:
        """Refuse what only a running run can take (gradients, weights): raise for no run or
        another run; for a finished run, return the refusal, which the caller raises unless the
        request is a retry of one taken before the finish."""
        if self.run_state == "idle":
            raise StateConflict("no run has started: POST /train first", stop=True)
        self._check_same_run(run_id)
        if self.run_state != "running":
            return StateConflict(f"run {self.run_id} is finished ({self.finish_reason})", stop=True)
        return None

    def should_stop(self, run_id: str | None = None) -> bool:
        with self._lock:
            return self.run_state != "running" or (run_id is not None and run_id != self.run_id)

    # -- registry ------------------------------------------------------------------------------

    def _touch(self, worker_id: str, url: str | None = None) -> WorkerRecord:
        """Note that a worker was heard from. Only a running run brings a worker (back) to
        `running`; after the end a late message must not make the run look busy again."""
        record = self.workers.get(worker_id)
        if record is None:
            state = "running" if self.run_state == "running" else "done"
            record = WorkerRecord(worker_id, url, state, time.time())
            self.workers[worker_id] = record
        record.last_seen = time.time()
        if url:
            record.url = url
        if record.state in ("starting", "lost") and self.run_state == "running":
            record.state = "running"
        return record

    def worker_started(self, worker_id: str, url: str | None, run_id: str | None = None) -> None:
        """Register a worker as running (an explicit registration counts in any state)."""
        with self._lock:
            self._check_same_run(run_id)
            record = self._touch(worker_id, url)
            record.state = "running"
            record.error = None
            self._dirty = True

    def worker_done(self, worker_id: str, error: str | None, run_id: str | None = None) -> str:
        with self._lock:
            self._check_same_run(run_id)
            record = self._touch(worker_id)
            record.state = "failed" if error else "done"
            record.error = error
            self._dirty = True
            finished = self._finish_if_no_worker_left()
            worker_state = record.state
        if finished:
            self.persist()
        return worker_state

    def heartbeat(self, worker_id: str, stats: dict[str, Any], run_id: str | None = None) -> bool:
        with self._lock:
            if self.should_stop(run_id):
                return True
            record = self._touch(worker_id)
            for key in ("steps_per_s", "last_reward", "metrics"):
                if stats.get(key) is not None:
                    setattr(record, key, stats[key])
            self._dirty = True
            return False

    def worker_accepted(self, worker_id: str) -> None:
        """The worker accepted POST /start_worker: its silence counts from now."""
        with self._lock:
            record = self.workers.get(worker_id)
            if record is not None:
                record.launching = False
                if record.state == "starting":
                    record.last_seen = time.time()

    def mark_failed(self, worker_id: str, error: str) -> None:
        with self._lock:
            record = self.workers.get(worker_id)
            if record is not None:
                record.state = "failed"
                record.error = error
                record.launching = False
                self._dirty = True

    def check_liveness(self) -> None:
        """Mark workers silent past the heartbeat timeout (or, before their first message, the start
        timeout) as lost (also after the end of a run:
        a worker that never said it stopped must not look active for ever); finish a run that
        nobody runs any more."""
        with self._lock:
            if self.config is None:
                return
            now = time.time()
            for record in self.workers.values():
                if record.state not in ACTIVE or record.launching:
                    continue
                name = "heartbeat_timeout_s"
                if record.state == "starting" and self.config.start_timeout_s is not None:
                    name = "start_timeout_s"
                limit = getattr(self.config, name)
                if now - record.last_seen > limit:
                    record.state = "lost"
                    record.error = f"no message for {now - record.last_seen:.1f} s ({name}={limit})"
                    self._dirty = True
            finished = self._finish_if_no_worker_left()
        if finished:
            self.persist()

    def _finish_if_no_worker_left(self) -> bool:
        if any(r.state in ACTIVE for r in self.workers.values()):
            return False
        return self._finish_locked("no worker is running any more")

    def active_workers(self) -> int:
        with self._lock:
            return sum(r.state in ACTIVE for r in self.workers.values())

    # -- statistics ----------------------------------------------------------------------------

    def report_episode(
        self,
        worker_id: str,
        reward: float,
        length: int,
        run_id: str | None = None,
        seq: int | None = None,
    ) -> dict[str, Any]:
        """Fold one finished episode into every statistic at once. Accepted in any state of the
        current run (an episode that ended just after the finish still happened); `stop` tells
        the worker whether to go on. A report whose `seq` this worker already used is a retry:
        answered like the first time (`duplicate: true`), counted once."""
        with self._lock:
            self._check_same_run(run_id)
            record = self._touch(worker_id)
            if seq is not None and seq <= record.last_seq:
                return self._duplicate_episode(record, seq)
            stats = self.stats
            stats.global_episode += 1
            stats.global_steps += length
            self._push_queue(stats.fold_average(reward))
            stats.last100.append(reward)
            improved = stats.raise_best(reward)
            record.episodes += 1
            record.steps += length
            record.last_reward = reward
            if seq is not None:
                record.last_seq = seq
            self._pending_rows.append(
                (stats.global_episode, worker_id, reward, length, round(time.time(), 3))
            )
            self._dirty = True
            reason = self._finish_reason() if self.run_state == "running" else None
            finished = bool(reason) and self._finish_locked(reason)
            reply = self._episode_reply(improved, duplicate=False)
            if seq is not None:
                self._episode_replies[worker_id] = (seq, reply)
        if finished:
            self.persist()
        return reply

    def _episode_reply(self, improved: bool, duplicate: bool) -> dict[str, Any]:
        stats = self.stats
        return {
            "global_episode": stats.global_episode,
            "moving_average": stats.moving_average,
            "best_score": stats.best_score,
            "improved": improved,
            "stop": self.run_state != "running",
            "duplicate": duplicate,
        }

    def _duplicate_episode(self, record: WorkerRecord, seq: int) -> dict[str, Any]:
        """The first attempt's reply when it is the last one kept, else the current figures."""
        record.duplicates += 1
        self._dirty = True
        last_seq, reply = self._episode_replies.get(record.worker_id, (None, None))
        if last_seq != seq or reply is None:
            return self._episode_reply(improved=False, duplicate=True)
        return {**reply, "stop": self.run_state != "running", "duplicate": True}

    def _finish_reason(self) -> str | None:
        cfg, stats = self.config, self.stats
        if cfg is None:
            return None
        if self.solved():
            return (
                f"solved: mean return of the last 100 episodes {stats.mean_return_100():.1f} "
                f">= {cfg.target_return}"
            )
        if cfg.max_episodes is not None and stats.global_episode >= cfg.max_episodes:
            return f"max_episodes={cfg.max_episodes} reached"
        if cfg.max_steps is not None and stats.global_steps >= cfg.max_steps:
            return f"max_steps={cfg.max_steps} reached"
        return None

    def solved(self) -> bool:
        """The mean return of the last 100 episodes reached the target (100 episodes needed)."""
        with self._lock:
            target = self.config.target_return if self.config else None
            return (
                target is not None
                and len(self.stats.last100) == 100
                and self.stats.mean_return_100() >= target
            )

    def _push_queue(self, value: float) -> None:
        if len(self.stats.queue) >= self.settings.queue_max:
            self.stats.queue.popleft()
            self.stats.queue_dropped += 1
        self.stats.queue.append(value)

    def push_queue(self, value: float) -> int:
        with self._lock:
            self._push_queue(value)
            self._dirty = True
            return len(self.stats.queue)

    def pop_queue(self) -> float | None:
        with self._lock:
            if not self.stats.queue:
                return None
            self._dirty = True
            return self.stats.queue.popleft()

    def clear_queue(self) -> None:
        with self._lock:
            self.stats.queue.clear()
            self._dirty = True

    def add_episodes(self, n: int) -> int:
        with self._lock:
            self.stats.global_episode += n
            self._dirty = True
            return self.stats.global_episode

    def fold_average(self, reward: float) -> float:
        with self._lock:
            self._dirty = True
            return self.stats.fold_average(reward)

    def raise_best(self, score: float) -> tuple[float, bool]:
        with self._lock:
            raised = self.stats.raise_best(score)
            self._dirty = self._dirty or raised
            return self.stats.best_score, raised

    # -- weights -------------------------------------------------------------------------------

    def _set_model(self, model: ActorCritic, optimizer_state: dict | None) -> None:
        assert self.config is not None
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=self.config.lr)
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self._spec = wire.spec_of(model)
        self._encoded = None

    @property
    def spec(self) -> dict[str, tuple[int, ...]]:
        return self._spec

    def _require_model(self) -> ActorCritic:
        if self.model is None:
            raise StateConflict("no run has started: POST /train first")
        return self.model

    def _weights_locked(self) -> tuple[bytes, int]:
        if self._encoded is None or self._encoded[0] != self.model_version:
            self._encoded = (self.model_version, wire.encode(self._require_model().state_dict()))
        return self._encoded[1], self.model_version

    def weights(self) -> tuple[bytes, int]:
        """The global weights as safetensors bytes, and their version."""
        with self._model_lock:
            return self._weights_locked()

    def _seen_update(self, worker_id: str, seq: int | None) -> bool:
        """Under `_model_lock`: True when this worker's update `seq` was applied already."""
        return seq is not None and seq <= self._update_seq.get(worker_id, 0)

    def _count_duplicate(self, worker_id: str) -> None:
        with self._lock:
            record = self.workers.get(worker_id)
            if record is not None:
                record.duplicates += 1
                self._dirty = True

    def apply_gradients(
        self,
        worker_id: str,
        version: int,
        body: bytes,
        run_id: str | None = None,
        seq: int | None = None,
    ) -> tuple[bytes, int, bool]:
        """Apply one worker's gradients with the master's optimizer; return the new weights, their
        version and whether the request was a retry of gradients already applied (then they are
        not applied again, even if the run finished since). Raises StateConflict (stale, or no
        running run) or WireError; nothing is applied then."""
        with self._lock:
            refusal = self._check_run(run_id)
            self._touch(worker_id)
            max_staleness = self.config.max_staleness
        try:
            grads = wire.decode(body, self._spec)
        except wire.WireError:
            with self._model_lock:
                self.updates_rejected += 1
            raise
        with self._model_lock:
            model = self._require_model()
            duplicate = self._seen_update(worker_id, seq)
            if not duplicate:
                if refusal is not None:
                    raise refusal
                staleness = self.model_version - version
                if not 0 <= staleness <= max_staleness:
                    self.updates_rejected += 1
                    why = (
                        f"{staleness} versions old (max_staleness={max_staleness})"
                        if staleness >= 0
                        else "from a version this master never had"
                    )
                    raise StateConflict(
                        f"gradients computed on version {version} are {why}; current version "
                        f"is {self.model_version}: pull the weights and compute them again"
                    )
                for name, param in model.named_parameters():
                    param.grad = grads[name]
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self._applied(worker_id, seq)
            body, version = self._weights_locked()
        if duplicate:
            self._count_duplicate(worker_id)
        return body, version, duplicate

    def _applied(self, worker_id: str, seq: int | None) -> None:
        """Under `_model_lock`: a new version of the global weights from this worker."""
        self.model_version += 1
        self.updates_applied += 1
        if seq is not None:
            self._update_seq[worker_id] = seq
        self._dirty = True

    def put_weights(
        self, worker_id: str, body: bytes, temporary: bool, seq: int | None = None
    ) -> tuple[int, bool]:
        """A worker's weights: its temporary slot, or (temporary=False) the new global weights.
        Returns the model version and whether this was a retry of weights already taken."""
        with self._lock:
            refusal = self._check_run(None)
            self._touch(worker_id)
        tensors = wire.decode(body, self._spec)
        with self._model_lock:
            # A temporary slot is simply overwritten, so a retry of it is harmless as it is.
            duplicate = not temporary and self._seen_update(worker_id, seq)
            if refusal is not None and not duplicate:
                raise refusal
            if temporary:
                self.temporary[worker_id] = body
                self._dirty = True
            elif not duplicate:
                self.model.load_state_dict(tensors)
                self._applied(worker_id, seq)
            version = self.model_version
        if duplicate:
            self._count_duplicate(worker_id)
        return version, duplicate

    # -- status --------------------------------------------------------------------------------

    def workers_public(self) -> list[dict[str, Any]]:
        now = time.time()
        with self._lock:
            return [r.public(now) for r in self.workers.values()]

    def status(self) -> dict[str, Any]:
        self.check_liveness()
        with self._lock:
            mean = self.stats.mean_return_100()
            out = {
                "state": self.run_state,
                "run_id": self.run_id,
                "finish_reason": self.finish_reason,
                "env_id": self.config.env_id if self.config else None,
                "global_episode": self.stats.global_episode,
                "global_steps": self.stats.global_steps,
                "best_score": self.stats.best_score,
                "moving_average": self.stats.moving_average,
                "mean_return_100": mean,
                "solved": self.solved(),
                "queue_length": len(self.stats.queue),
                "queue_dropped": self.stats.queue_dropped,
                "elapsed_s": round(self.elapsed_s(), 3),
                "config": self.config.model_dump() if self.config else None,
                "workers": self.workers_public(),
            }
        with self._model_lock:
            out["model_version"] = self.model_version
            out["updates_applied"] = self.updates_applied
            out["updates_rejected"] = self.updates_rejected
        return out

    # -- persistence ---------------------------------------------------------------------------

    def persist(self, force: bool = False, clean: bool = False) -> bool:
        """Write the state to the run folder if anything changed (or `force`). `clean`: this is
        the last save of a process that shuts down, so nothing will happen after it."""
        snap = self._snapshot(force, clean)
        if snap is None:
            return False
        try:
            self.store.save(snap)
        except BaseException:
            with self._lock:  # keep the rows for the next attempt
                self._pending_rows[:0] = snap.new_episodes
                self._dirty = True
            raise
        return True

    def _snapshot(self, force: bool, clean: bool = False) -> Snapshot | None:
        with self._lock, self._model_lock:
            if not (self._dirty or force):
                return None
            state = {
                "run_id": self.run_id,
                "run_state": self.run_state,
                "finish_reason": self.finish_reason,
                "elapsed_s": self.elapsed_s(),
                "stats": self.stats.to_json(),
                "global_episode": self.stats.global_episode,
                "workers": [asdict(r) for r in self.workers.values()],
                "model_version": self.model_version,
                "updates_applied": self.updates_applied,
                "updates_rejected": self.updates_rejected,
                "update_seq": dict(self._update_seq),
                "saved_at": time.time(),
                "clean_shutdown": clean,
            }
            weights, optimizer = b"", b""
            if self.model is not None:
                buf = io.BytesIO()
                torch.save(self.optimizer.state_dict(), buf)
                weights, optimizer = self._weights_locked()[0], buf.getvalue()
            config = self.config.model_dump() if self.config else {}
            snap = Snapshot(
                config={"run_id": self.run_id, **config},
                state=state,
                weights=weights,
                optimizer=optimizer,
                new_episodes=self._pending_rows,
                temporary=dict(self.temporary),
            )
            self._pending_rows = []
            self._dirty = False
            return snap

    def _restore(self) -> bool:
        """Resume from the run folder; True when model versions were skipped (see
        VERSIONS_SKIPPED_AFTER_A_CRASH)."""
        snap = self.store.load()
        if snap is None:
            return False
        config_data = dict(snap.config)
        config_data.pop("run_id", None)
        state = snap.state
        self.run_id = state["run_id"]
        self.run_state = state["run_state"]
        self.finish_reason = state.get("finish_reason")
        self._elapsed_before = float(state.get("elapsed_s", 0.0))
        self._running_since = time.monotonic() if self.run_state == "running" else None
        self.stats = Stats.from_json(state["stats"])
        now = time.time()
        self.workers = {}
        for data in state.get("workers", []):
            record = WorkerRecord(**data)
            record.launching = False  # a launch does not survive the process that made it
            if record.state in ACTIVE:
                record.last_seen = now  # give every worker a full timeout to come back
            self.workers[record.worker_id] = record
        self.temporary = dict(snap.temporary)
        if not snap.weights:
            return False  # the state of an idle master: counters, no run
        self.config = TrainConfig(**config_data)
        model = build_model(self.config.env_id, self.config.env_kwargs, self.config.hidden_sizes)
        model.load_state_dict(wire.decode(snap.weights, wire.spec_of(model)))
        optimizer_state = torch.load(io.BytesIO(snap.optimizer), weights_only=True)
        self._set_model(model, optimizer_state)
        self.model_version = int(state.get("model_version", 0))
        self.updates_applied = int(state.get("updates_applied", 0))
        self.updates_rejected = int(state.get("updates_rejected", 0))
        self._update_seq = {str(k): int(v) for k, v in state.get("update_seq", {}).items()}
        if self.run_state == "running" and not state.get("clean_shutdown", False):
            self.model_version += VERSIONS_SKIPPED_AFTER_A_CRASH
            self._dirty = True
            return True
        return False
