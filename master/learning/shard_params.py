"""The parameter server's side of a run with shards (a part of master/learning/parameter_server.py
`ParameterServer`, under its lock): admitting a committed push and handing it to the shards as
the next version, keeping the master's copy of the network as the shards last gave it, and putting
every shard back to that copy after one failed.

In such a run the master's network (`net`) is the shards' weights and optimizer state at
`_net_version`: brought up to date (`_fresh_from_shards`) before anything reads it whole (a save,
the evaluator, `GET /global_model_weights`), never stepped here.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from a3c_http.config.settings import Settings
from a3c_http.config.training import TrainConfig
from a3c_http.optim.optimizers import lr_scale
from master.errors import Invalid, StateConflict
from master.learning.admission import norm_problem
from master.learning.rounds import Update
from master.shards.coordinator import ShardsDown, ShardSet

if TYPE_CHECKING:
    from a3c_http.optim.flatnet import FlatNetwork
    from master.learning.target import TargetNetwork


class ShardedParameters:
    """The mixin; `ParameterServer` has the `lock`, `net`, `version` and screening it uses."""

    lock: threading.RLock
    net: FlatNetwork | None
    version: int
    shards: ShardSet | None = None
    _net_version = 0
    # A dqn run's: the version the shards' target network is at (master/learning/target.py's
    # rule, kept here as the shards keep it), and the master's copy of it, as last gathered.
    _shard_target_version: int | None = None
    _encoded: Any

    def start_shards(self, settings: Settings, config: TrainConfig, on_failure: Any) -> None:
        """Start the run's shards and hand them the network at the current version (a fresh run's
        or a resumed one's)."""
        shards = ShardSet(settings, config, on_failure)
        with self.lock:
            try:
                shards.open(self._require_net(), self.version, self._target_kept())
            except Exception:
                shards.close()
                raise
            self._net_version = self.version
            self._shard_target_version = self.target.version
            self.shards = shards

    def drop_shards(self) -> None:
        """The shards are lost for good: the network stays as last gathered, under the next
        version (what was applied since is lost, and its weights keep their own version), and
        the shards are closed."""
        with self.lock:
            if self.shards is not None and self._net_version != self.version:
                self.version += 1
                self._net_version = self.version
                self._encoded = None
        self.close_shards()

    def close_shards(self) -> None:
        with self.lock:
            shards, self.shards = self.shards, None
        if shards is not None:
            shards.close()

    def check_norm(self, norm: float, config: TrainConfig) -> None:
        """Invalid (counted as refused) for a push whose shards' sums make a norm its worker
        cannot have clipped to."""
        why = norm_problem(norm, config, self._require_net().wire.relative_error)
        if why is not None:
            self.count_invalid()
            raise Invalid(f"{why}; nothing applied")

    def commit_sharded(
        self,
        update: Update,
        config: TrainConfig,
        refusal: StateConflict | None,
    ) -> tuple[int, bool]:
        """A push staged on every shard (its norm from their receipts): screened as any gradient
        push (a retry is answered, not applied again), then the next version, which every shard
        applies. Returns the version to fetch the weights at and whether it was a retry."""
        with self.lock:
            shards = self.shards
            if shards is None:
                raise ShardsDown("the run's shards are starting")
            if self._is_retry(update.worker_id, update.seq):
                return self.version, True
            self._screen(update, config, refusal, sync=False)
            staleness = self.version - update.version
            net = self._require_net()
            lr = net.optimizer.param_groups[0]["lr"] * lr_scale(staleness, config.staleness_scaling)
            self.version += 1
            shards.decide(self.version, update.worker_id, update.seq or 0, lr)
            every = self.target.every
            if every is not None and self.version - (self._shard_target_version or 0) >= every:
                self._shard_target_version = self.version  # as every shard refreshes it
            self.staleness_total += staleness
            self.updates_applied += 1
            self._remember_seq(update.worker_id, update.seq)
            self._join_outlier_window(update)
            return self.version, False

    def _fresh_from_shards(self, target: bool = False) -> None:
        """The master's network as the shards hold it now (`target`: at least as new as the
        target network the shards hold), the caller holding the lock, so no push is decided
        meanwhile; ShardsDown while they cannot give it."""
        if self.shards is None:
            return
        stale_target = target and self._shard_target_version != self.target.version
        if self._net_version != self.version or stale_target:
            net = self._require_net()
            self._net_version = self.shards.gather(net, self._target_kept())
            self._encoded = None

    def _target_kept(self) -> TargetNetwork | None:
        """The run's target network where it has one the shards keep (dqn), else None."""
        target = self.target
        return target if target.every is not None and target.vector is not None else None

    def reset_shards(self) -> int:
        """After a shard failed: start what ended, then every shard from the network as last
        gathered, under the next version (a new name for those weights; what was decided since
        is lost, as after a master's crash). Returns that version."""
        shards = self.shards
        if shards is None:
            return self.version
        shards.restart_failed()
        with self.lock:
            self.version += 1
            self._net_version = self.version
            self._encoded = None
            shards.open(self._require_net(), self.version, self._target_kept())
            self._shard_target_version = self.target.version
            return self.version

    def shards_status(self) -> list[dict[str, Any]] | None:
        shards = self.shards
        return shards.status() if shards is not None else None
