"""The parameter server's persistence (master/persistence/saver.py and resume.py): what the run
folder keeps of it and how a master takes that up again. A base of `ParameterServer`
(master/learning/parameter_server.py), apart because it is a concern of its own; its methods run
under the server's lock and use its fields."""

from __future__ import annotations

import io
from typing import Any

import torch

from a3c_http.algos.registry import algorithm_class, learns_from_experience
from a3c_http.config.training import TrainConfig
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.optim.flatnet import non_finite_optimizer_state
from a3c_http.store.runstore import NonFiniteValue
from master.learning.admission import SeqWindow


def refresh_every(config: TrainConfig) -> int | None:
    """How often the parameter server refreshes the target network itself (the run's
    algorithm says: a dqn run's every `target_update` versions; an apex run's learner keeps its
    own)."""
    return algorithm_class(config).target_refresh_every(config)


class SavedParameters:
    """The run folder's part of the parameter server: its counters (`state`), its tensors
    (`blobs`) and taking both up again (`restore`)."""

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {
                "model_version": self.version,
                "updates_applied": self.updates_applied,
                "updates_rejected": self.updates_rejected,
                "first_version": self.first_version,
                "update_seq": {w: window.to_json() for w, window in self._seq_windows.items()},
                "sync_rounds": self.sync_rounds,
                "sync_gradients": self.sync_gradients,
                "staleness_total": self.staleness_total,
                "rejected_by": dict(self.rejected_by),
                "target_version": self.target.version,
                **self.outliers.state(),
            }

    def blobs(self) -> tuple[bytes, bytes, bytes | None]:
        """The weights, the optimizer's state and the target network (None without one), as
        bytes. NonFiniteValue, naming the tensor,
        when either holds a NaN or an infinity: the run folder keeps its last save rather than
        one that no master could resume from."""
        with self.lock:
            net = self._require_net()
            optimizer = self.optimizer_state()
            bad = net.non_finite() or non_finite_optimizer_state(optimizer)
            if bad is not None:
                raise NonFiniteValue(
                    f"{bad} holds NaN or infinite values (model version {self.version}): not "
                    "saved, the run folder keeps its last save"
                )
            buf = io.BytesIO()
            torch.save(optimizer, buf)
            return self.stored_weights()[0], buf.getvalue(), self.target.blob(net)

    def restore(
        self,
        config: TrainConfig,
        model: ActorCritic,
        state: dict[str, Any],
        optimizer_state: dict[str, Any],
        temporary: dict[str, bytes],
        skip_versions: int,
        target: torch.Tensor | None = None,
    ) -> None:
        """Take up a saved run (master/persistence/resume.py read and checked it); `skip_versions`:
        how far the version jumps after a crash; `target`: the saved target network's weights.
        A run with a learner beside the master keeps its learner's state as saved, whatever its
        algorithm put in it, to start the learner from (the master steps no optimizer then)."""
        learner = learns_from_experience(config)
        with self.lock:
            self._set_model(config, model, None if learner else optimizer_state)
            if learner:
                self._learner_optimizer = optimizer_state
            self.version = int(state.get("model_version", 0)) + skip_versions
            self.first_version = int(state.get("first_version", 0))
            self.updates_applied = int(state.get("updates_applied", 0))
            self.updates_rejected = int(state.get("updates_rejected", 0))
            self._seq_windows = {
                str(k): SeqWindow.from_json(v) for k, v in state.get("update_seq", {}).items()
            }
            self.sync_rounds = int(state.get("sync_rounds", 0))
            self.sync_gradients = int(state.get("sync_gradients", 0))
            self.staleness_total = int(state.get("staleness_total", 0))
            self.rejected_by = {str(k): int(v) for k, v in state.get("rejected_by", {}).items()}
            self.outliers.restore(state)
            self.temporary = dict(temporary)
            saved_version = state.get("target_version")
            self.target.restore(
                self.net, self.version, algorithm_class(config).target_network,
                refresh_every(config), target,
                int(saved_version) if isinstance(saved_version, int) else None,
            )  # fmt: skip
