"""The parameter server: the global network, its optimizer, its version and everything that changes
with it (the encoded weights, the workers' temporary slots, which updates were applied), under one
lock.

A version names one set of global weights, for ever: it rises by one at every change, goes on rising
across the runs of a run folder, and a run remembers the version it began at, so gradients computed
on an earlier run's weights are refused however close their version is. Updates are never applied
twice: a worker numbers its updates (`X-A3C-Seq`), and the number of the last one applied for each
worker is checked and recorded in the same critical section as the change itself.
"""

from __future__ import annotations

import io
import threading
from typing import Any

import torch

from a3c_http import wire
from a3c_http.a3c import make_optimizer, set_learning_rate
from a3c_http.config import TrainConfig
from a3c_http.model import ActorCritic
from a3c_http.normalize import absorb
from master.errors import StateConflict


class ParameterServer:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.model: ActorCritic | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.spec: dict[str, tuple[int, ...]] = {}
        self.version = 0
        self.first_version = 0  # the version the current run began at
        self.updates_applied = 0
        self.updates_rejected = 0
        self.temporary: dict[str, bytes] = {}
        self.temporary_revision = 0  # rises with every change of a temporary slot
        self._encoded: tuple[int, bytes] | None = None
        self._update_seq: dict[str, int] = {}  # worker -> X-A3C-Seq of its last applied update

    def begin(self, config: TrainConfig, model: ActorCritic, next_version: bool) -> None:
        """Fresh weights and counters for a new run; `next_version`: an earlier run used this
        folder, so the new weights get the next version."""
        with self.lock:
            self._set_model(config, model, optimizer_state=None)
            self.version += 1 if next_version else 0
            self.first_version = self.version
            self.updates_applied = self.updates_rejected = 0
            self.temporary = {}
            self.temporary_revision += 1
            self._update_seq = {}

    def _set_model(self, config: TrainConfig, model: ActorCritic, optimizer_state: Any) -> None:
        self.model = model
        self.optimizer = make_optimizer(model.parameters(), config)
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self.spec = wire.spec_of(model)
        self._encoded = None

    def _require_model(self) -> ActorCritic:
        if self.model is None:
            raise StateConflict("no run has started: POST /train first")
        return self.model

    def weights(self) -> tuple[bytes, int]:
        """The global weights as safetensors bytes (encoded once per version), and their version."""
        with self.lock:
            if self._encoded is None or self._encoded[0] != self.version:
                self._encoded = (self.version, wire.encode(self._require_model().state_dict()))
            return self._encoded[1], self.version

    def decode(self, body: bytes) -> dict[str, torch.Tensor]:
        """A worker's tensors, checked against the model; a body that does not fit is counted
        as a refused update (WireError)."""
        try:
            return wire.decode(body, self.spec)
        except wire.WireError:
            with self.lock:
                self.updates_rejected += 1
            raise

    def _seen(self, worker_id: str, seq: int | None) -> bool:
        return seq is not None and seq <= self._update_seq.get(worker_id, 0)

    def _applied(self, worker_id: str, seq: int | None) -> None:
        self.version += 1
        self.updates_applied += 1
        if seq is not None:
            self._update_seq[worker_id] = seq

    def apply_gradients(
        self,
        worker_id: str,
        version: int,
        grads: dict[str, torch.Tensor],
        seq: int | None,
        max_staleness: int,
        refusal: StateConflict | None,
        lr: float | None = None,
    ) -> tuple[bytes, int, bool]:
        """Apply gradients computed on `version` with the optimizer (at learning rate `lr`, when
        given) and merge the batch moments the body carries for the model's running statistics;
        return the new weights, their version and whether this was a retry of gradients applied
        already (then nothing is applied again, even if the run finished since). `refusal`: the
        run's reason to refuse any update, raised unless the request is such a retry."""
        with self.lock:
            model = self._require_model()
            duplicate = self._seen(worker_id, seq)
            if not duplicate:
                if refusal is not None:
                    raise refusal
                self._check_fresh(version, max_staleness)
                for name, param in model.named_parameters():
                    param.grad = grads[name]
                if lr is not None:
                    set_learning_rate(self.optimizer, lr)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                absorb(model, grads)
                self._applied(worker_id, seq)
            body, version = self.weights()
        return body, version, duplicate

    def _check_fresh(self, version: int, max_staleness: int) -> None:
        if version < self.first_version:
            why = f"from an earlier run (this run began at version {self.first_version})"
        elif version > self.version:
            why = "from a version this master never had"
        elif self.version - version > max_staleness:
            why = f"{self.version - version} versions old (max_staleness={max_staleness})"
        else:
            return
        self.updates_rejected += 1
        raise StateConflict(
            f"gradients computed on version {version} are {why}; current version is "
            f"{self.version}: pull the weights and compute them again"
        )

    def put_weights(
        self,
        worker_id: str,
        tensors: dict[str, torch.Tensor],
        body: bytes,
        temporary: bool,
        seq: int | None,
        refusal: StateConflict | None,
    ) -> tuple[int, bool]:
        """A worker's weights: its temporary slot, or (temporary=False) the new global weights.
        Returns the model version and whether this was a retry of weights already taken."""
        with self.lock:
            # A temporary slot is simply overwritten, so a retry of it is harmless as it is.
            duplicate = not temporary and self._seen(worker_id, seq)
            if refusal is not None and not duplicate:
                raise refusal
            if temporary:
                self.temporary[worker_id] = body
                self.temporary_revision += 1
            elif not duplicate:
                self._require_model().load_state_dict(tensors)
                self._applied(worker_id, seq)
            return self.version, duplicate

    def counters(self) -> dict[str, int]:
        with self.lock:
            return {
                "model_version": self.version,
                "updates_applied": self.updates_applied,
                "updates_rejected": self.updates_rejected,
            }

    # -- persistence (master/persistence.py) ---------------------------------------------------

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {
                **self.counters(),
                "first_version": self.first_version,
                "update_seq": dict(self._update_seq),
            }

    def blobs(self) -> tuple[bytes, bytes]:
        """The weights and the optimizer's state, as bytes."""
        with self.lock:
            buf = io.BytesIO()
            torch.save(self.optimizer.state_dict(), buf)
            return self.weights()[0], buf.getvalue()

    def restore(
        self,
        config: TrainConfig,
        model: ActorCritic,
        state: dict[str, Any],
        optimizer: bytes,
        temporary: dict[str, bytes],
        skip_versions: int,
    ) -> None:
        with self.lock:
            optimizer_state = torch.load(io.BytesIO(optimizer), weights_only=True)
            self._set_model(config, model, optimizer_state)
            self.version = int(state.get("model_version", 0)) + skip_versions
            self.first_version = int(state.get("first_version", 0))
            self.updates_applied = int(state.get("updates_applied", 0))
            self.updates_rejected = int(state.get("updates_rejected", 0))
            self._update_seq = {str(k): int(v) for k, v in state.get("update_seq", {}).items()}
            self.temporary = dict(temporary)
