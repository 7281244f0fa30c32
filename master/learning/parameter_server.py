"""The parameter server: the global network, its optimizer, its version and everything that changes
with it (the encoded weights, the workers' temporary slots, which updates were applied), under one
lock.

The global network is a `FlatNetwork` (a3c_http/optim/flatnet.py): its weights are one float32
vector, which the optimizer steps as one tensor. Bodies to and from the workers are in the run's
`wire_dtype` (`net.wire`, one conversion each way); the weights body is made once per version,
outside the lock (under it only the vector is copied), and serves every reply and `GET` of that
version. Everything the master keeps is float32: the weights, the optimizer, the statistics, the
temporary slots, the run folder's weights (`blobs`) and what the evaluator plays
(`stored_weights`).

A version names one set of global weights, for ever: it rises by one at every change, goes on rising
across the runs of a run folder, and a run remembers the version it began at, so gradients computed
on an earlier run's weights are refused however close their version is. Updates are never applied
twice: a worker numbers its updates (`X-A3C-Seq`), and the number of the last one applied for each
worker is checked and recorded in the same critical section as the change itself (per worker, a
window of numbers: pushes in flight may arrive out of order, admission.py `SeqWindow`).

Every gradient and whole weights are checked when they are decoded, before anything of their push is
counted (master/learning/admission.py: what a worker may not decide). A gradient is then screened:
not a retry, from the running run, fresh enough, and not an outlier (admission.py as well).
Gradients mode applies it at once; sync mode adds it to the current round and applies the round's
mean when the round closes (master/learning/rounds.py `SyncRounds`, the parameter server's methods
for it). A step that would leave a weight, a statistic or the optimizer's state non-finite is undone
and refused (a3c_http/optim/flatnet.py).

In a run with a learner beside the master (ppo, impala, apex, apex_dpg, sac) the learner steps, and
the parameter server only takes what it publishes (`publish`): each version's weights into the
network, and the learner's optimizer state as it last sent it (whatever its algorithm keeps there),
kept to save and to start a learner from and never loaded into the network's optimizer, which does
not step in such a run.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

from a3c_http.algos.registry import algorithm_class
from a3c_http.config.training import TrainConfig
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.optim.flatnet import FlatNetwork, NonFiniteStep
from a3c_http.optim.optimizers import lr_scale, set_learning_rate
from a3c_http.wire import tensors as wire
from master.errors import Invalid, StateConflict
from master.learning.admission import (
    OutlierFilter,
    RunLimits,
    SeqWindow,
    gradient_problem,
    staleness_problem,
    weights_problem,
)
from master.learning.rounds import Outcome, SyncRounds, Update
from master.learning.saved import SavedParameters, refresh_every
from master.learning.shard_params import ShardedParameters
from master.learning.target import TargetNetwork


class ParameterServer(SyncRounds, SavedParameters, ShardedParameters):
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.net: FlatNetwork | None = None
        self._learner_optimizer: dict[str, Any] | None = None  # `_set_model`
        self.version = 0
        self.first_version = 0  # the version the current run began at
        self.updates_applied = 0
        self.updates_rejected = 0
        self.rejected_by: dict[str, int] = {}  # updates_rejected by reason (`_reject`)
        self.temporary: dict[str, bytes] = {}
        self.temporary_revision = 0  # rises with every change of a temporary slot
        self._encoded: tuple[int, bytes] | None = None  # (version, its weights body)
        self._seq_windows: dict[str, SeqWindow] = {}  # worker -> X-A3C-Seq of updates applied
        self._claimed: set[tuple[str, int]] = set()  # experience pushes being taken (`claim`)
        self.outliers = OutlierFilter()
        self.staleness_total = 0  # versions between the weights of applied gradients and theirs
        self._round_numbers = itertools.count(1)  # never reused, so a late timeout closes no other
        self._reset_rounds()
        self.target = TargetNetwork()  # dqn and apex runs' (master/learning/target.py)

    def start_run(self, config: TrainConfig, model: ActorCritic, next_version: bool) -> None:
        """Fresh weights and counters for a new run; `next_version`: an earlier run used this
        folder, so the new weights get the next version."""
        with self.lock:
            self._abandon_round(StateConflict("a new run began: this round's run is over", True))
            self._set_model(config, model, optimizer_state=None)
            self.version += 1 if next_version else 0
            self.first_version = self.version
            self.updates_applied = self.updates_rejected = 0
            self.rejected_by = {}
            self.temporary = {}
            self.temporary_revision += 1
            self._seq_windows = {}
            self.outliers.reset()
            self._reset_rounds()
            self.staleness_total = 0
            kept = algorithm_class(config).target_network
            self.target.reset(self.net, self.version, kept, refresh_every(config))

    def _set_model(self, config: TrainConfig, model: ActorCritic, optimizer_state: Any) -> None:
        self.net = FlatNetwork(model, config, optimizer_state)
        # A learner's optimizer state as it last sent it (runs with a learner beside the
        # master): kept to save and to start a learner from, never loaded into an optimizer
        # of the master's, which never steps in such a run.
        self._learner_optimizer: dict[str, Any] | None = None
        self._encoded = None

    def optimizer_state(self) -> dict[str, Any]:
        """The run's optimizer state: its learner's as it last sent it, else the network's
        optimizer's (the one that steps in a gradient run; a resumed learner run's as saved)."""
        with self.lock:
            if self._learner_optimizer is not None:
                return self._learner_optimizer
            self._fresh_from_shards()
            return self._require_net().optimizer_state()

    @property
    def model(self) -> ActorCritic | None:
        return self.net.model if self.net is not None else None

    @property
    def spec(self) -> dict[str, tuple[int, ...]]:
        return self.net.layout.spec if self.net is not None else {}

    def _require_net(self) -> FlatNetwork:
        if self.net is None:
            raise StateConflict("no run has started: POST /train first")
        return self.net

    def weights(self) -> tuple[bytes, int]:
        """The global weights as safetensors bytes in the run's wire dtype, made once per
        version (from the vector itself, under the lock: one pass over it; a snapshot first and
        the bytes after the lock were three), and their version."""
        with self.lock:
            self._fresh_from_shards()
            cached = self._encoded
            if cached is None or cached[0] != self.version:
                net = self._require_net()
                cached = self._encoded = (self.version, net.wire.encode(net.flat))
            return cached[1], cached[0]

    def stored_weights(self) -> tuple[bytes, int]:
        """The global weights in float32 whatever the wire dtype (saved, and played by the
        evaluator), and their version."""
        with self.lock:
            net = self._require_net()
            if net.wire.dtype == "float32":
                return self.weights()
            self._fresh_from_shards()
            version, vector = self.version, net.snapshot()
        return net.layout.encode(vector), version

    def decode(
        self, body: bytes | bytearray, gradients: bool = False
    ) -> tuple[torch.Tensor, dict[str, str]]:
        """A worker's tensors as one vector, checked against the model, and the body's metadata;
        a body that does not fit is counted as a refused update (WireError). `gradients`: the
        parameters' finiteness is left to `checked_update`, whose norm shows it."""
        try:
            return self._require_net().wire.decode(body, finite_params=not gradients)
        except wire.WireError:
            with self.lock:
                self._reject("invalid")
            raise

    def count_invalid(self) -> None:
        """An update refused for what its push reported (admission.py `RunLimits`)."""
        with self.lock:
            self._reject("invalid")

    def _reject(self, reason: str, n: int = 1) -> None:
        """Count `n` refused updates: invalid (a body that does not fit), stale (too old, of an
        earlier run, or in sync mode not of the current version), outlier, round (sync mode: a
        second push in a round, or a round abandoned)."""
        self.updates_rejected += n
        self.rejected_by[reason] = self.rejected_by.get(reason, 0) + n

    def _is_retry(self, worker_id: str, seq: int | None) -> bool:
        return seq is not None and worker_id in self._seq_windows and self._seq_windows[
            worker_id
        ].seen(seq)

    def _remember_seq(self, worker_id: str, seq: int | None) -> None:
        if seq is not None:
            self._seq_windows.setdefault(worker_id, SeqWindow()).add(seq)

    def claim(self, worker_id: str, seq: int | None) -> bool:
        """Whether an experience push is new (not a retry of one taken or being taken); a new
        one stays claimed until `settle`."""
        with self.lock:
            if seq is None:
                return True
            if self._is_retry(worker_id, seq) or (worker_id, seq) in self._claimed:
                return False
            self._claimed.add((worker_id, seq))
            return True

    def settle(self, worker_id: str, seq: int | None, taken: bool) -> None:
        """The end of a `claim`: taken (its retries are answered), or refused (judged afresh)."""
        if seq is None:
            return
        with self.lock:
            self._claimed.discard((worker_id, seq))
            if taken:
                self._remember_seq(worker_id, seq)

    def checked_update(
        self,
        worker_id: str,
        version: int,
        vector: torch.Tensor,
        config: TrainConfig,
        limits: RunLimits,
        seq: int | None = None,
        loss: float | None = None,
        norm: float | None = None,
    ) -> Update:
        """A worker's decoded gradient vector as an update, checked (admission.py
        `gradient_problem`); Invalid, counted as a refused update, when it does not pass. The
        update's norm, for the outlier check, is the larger of the one reported (before clipping)
        and the one computed here."""
        computed, why = gradient_problem(self._require_net(), vector, config, limits)
        if why is not None:
            with self.lock:
                self._reject("invalid")
            raise Invalid(f"{why}; nothing applied")
        return Update(worker_id, version, vector, seq, loss, max(norm or 0.0, computed))

    def set_learning_rate(self, lr: float) -> None:
        """The learning rate of the next optimizer steps (lr_schedule)."""
        with self.lock:
            if self.net is not None:
                set_learning_rate(self.net.optimizer, lr)

    def apply_gradients(
        self, update: Update, config: TrainConfig, refusal: StateConflict | None
    ) -> Outcome:
        """Apply gradients with the optimizer (gradients mode): the outcome is the new weights
        and whether this was a retry of gradients applied already (then nothing is applied
        again, even if the run finished since). `refusal`: the run's reason to refuse any
        update, raised unless the request is such a retry."""
        with self.lock:
            duplicate = self._is_retry(update.worker_id, update.seq)
            if not duplicate:
                self._screen(update, config, refusal, sync=False)
                self._step([update], config.staleness_scaling)
                self._join_outlier_window(update)
        return Outcome.ready(self.weights(), duplicate)

    def _screen(
        self, update: Update, config: TrainConfig, refusal: StateConflict | None, sync: bool
    ) -> None:
        """Refuse what must not be applied: a finished run's, a stale or an outlier update."""
        if refusal is not None:
            raise refusal
        why = staleness_problem(
            update.version, self.version, self.first_version, config.max_staleness, sync
        )
        if why is not None:
            self._reject("stale")
            raise StateConflict(why)
        why = self.outliers.judge(
            update.worker_id, update.norm, update.loss, config.outlier_sigma, config.outlier_warmup
        )
        if why is not None:
            self._reject("outlier")
            raise StateConflict(f"{why}; nothing applied: pull the weights and go on")

    def _join_outlier_window(self, update: Update) -> None:
        """A screened update was taken: it joins its worker's outlier window."""
        self.outliers.accept(update.worker_id, update.norm, update.loss)

    def _step(self, updates: list[Update], scaling: str = "none") -> None:
        """One optimizer step on the mean of the updates' gradients, its learning rate scaled by
        their staleness as `scaling` says (`lr_scale`); the version rises once. A step that would
        leave anything non-finite is undone and refused (StateConflict)."""
        staleness = sum(self.version - u.version for u in updates)
        scale = lr_scale(staleness / len(updates), scaling)
        # Every update was checked (`checked_update`): a single one's norm bounds its step.
        checked = updates[0].norm if len(updates) == 1 else None
        try:
            self._require_net().step([u.vector for u in updates], scale, checked)
        except NonFiniteStep as exc:
            self._reject("invalid", len(updates))
            raise StateConflict(f"{exc}: pull the weights and go on") from None
        self.staleness_total += staleness
        self.version += 1
        self.target.follow(self.net, self.version)
        self.updates_applied += len(updates)
        for u in updates:
            self._remember_seq(u.worker_id, u.seq)

    def put_weights(
        self,
        worker_id: str,
        vector: torch.Tensor,
        temporary: bool,
        seq: int | None,
        refusal: StateConflict | None,
    ) -> tuple[int, bool]:
        """A worker's weights (a decoded vector): its temporary slot, or (temporary=False) the new
        global weights. Returns the model version and whether this was a retry of weights already
        taken. Raises Invalid for global weights that cannot be used (admission.py
        `weights_problem`). A slot keeps the weights as this master encodes them for its run
        folder (float32): the size of the model, whatever metadata or dtype the body carried."""
        net = self._require_net()
        if not temporary:
            why = weights_problem(net, vector)
            if why is not None:
                with self.lock:
                    self._reject("invalid")
                raise Invalid(f"these weights cannot become the global weights: {why}")
        body = net.layout.encode(vector) if temporary else b""
        with self.lock:
            # A temporary slot is simply overwritten, so a retry of it is harmless as it is.
            duplicate = not temporary and self._is_retry(worker_id, seq)
            if refusal is not None and not duplicate:
                raise refusal
            if temporary:
                self.temporary[worker_id] = body
                self.temporary_revision += 1
            elif not duplicate:
                net.load(vector)
                self._abandon_round(
                    StateConflict(
                        f"worker {worker_id} replaced the global weights while this round "
                        "gathered gradients: pull the weights and compute them again"
                    )
                )
                self.version += 1
                self.updates_applied += 1
                self._remember_seq(worker_id, seq)
            return self.version, duplicate

    def publish(
        self,
        version: int,
        weights: torch.Tensor,
        optimizer_state: dict[str, Any] | None,
        target: tuple[torch.Tensor, int] | None = None,
    ) -> None:
        """The learner's weights of `version` and, when sent, its optimizer's state and its
        target network (with the target's version)."""
        with self.lock:
            net = self._require_net()
            net.load(weights)
            if optimizer_state is not None:
                self._learner_optimizer = optimizer_state
            if target is not None:
                self.target.take(*target)
            if version > self.version:  # each version an update (the master may see several)
                self.updates_applied += version - self.version
                self.version = version
            self._encoded = None

    def target_weights(self) -> tuple[bytes, int]:
        """The target network's weights in the run's wire dtype and its version (StateConflict
        when the run keeps none)."""
        with self.lock:
            self._fresh_from_shards(target=True)
            return self.target.body(self._require_net())

    def counters(self) -> dict[str, Any]:
        with self.lock:
            rounds, applied = self.sync_rounds, self.updates_applied
            return {
                "model_version": self.version,
                "target_version": self.target.version,  # dqn and apex runs, else None
                "updates_applied": self.updates_applied,
                "updates_rejected": self.updates_rejected,
                "updates_refused_outlier": self.outliers.refused,
                "updates_rejected_by": dict(self.rejected_by),
                "sync_rounds": rounds,
                "sync_gradients_per_round": self.sync_gradients / rounds if rounds else None,
                "staleness_mean": round(self.staleness_total / applied, 3) if applied else None,
                # The sum behind the mean: a window's own mean is the difference of two
                # readings over that of updates_applied (`scripts/bench.py scale`).
                "staleness_total": self.staleness_total,
            }
