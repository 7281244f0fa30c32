"""The target network of a value-based run (`algo` dqn and apex): the global weights of one earlier
version, which the DQN loss bootstraps from (a3c_http/algos/dqn/loss.py).

The parameter server keeps it under its lock, beside the global network. In a dqn run it refreshes
it itself: whenever an applied update takes the weights `target_update` versions past it, the
target becomes those weights (`follow`); the workers fetch it by its own version
(`GET /target_model_weights`, `If-None-Match`). In an apex run the learner keeps its own and sends
each new one with its weights (`take`), versioned by the update it was taken in. Either way it is
saved with the run (the run folder's `target` blob, its version in the state) and taken up again
on resume (`restore`); a run saved without one starts from its weights.
"""

from __future__ import annotations

import torch

from a3c_http.optim.flatnet import FlatNetwork
from master.errors import StateConflict


class TargetNetwork:
    def __init__(self) -> None:
        self.every: int | None = None  # dqn: refreshed every this many versions; else None
        self.kept = False  # whether this run has one (dqn, apex)
        self.version: int | None = None
        self.vector: torch.Tensor | None = None  # float32, the layout of the global network
        self._encoded: tuple[int, bytes] | None = None  # (version, its wire body)

    def reset(self, net: FlatNetwork, version: int, kept: bool, every: int | None) -> None:
        """A new run: a target network (`kept`) of the run's first weights, or none."""
        self.kept, self.every = kept, every
        self.version = self.vector = self._encoded = None
        if kept:
            self._set(net.snapshot(), version)

    def _set(self, vector: torch.Tensor, version: int) -> None:
        self.vector, self.version, self._encoded = vector, version, None

    def follow(self, net: FlatNetwork, version: int) -> None:
        """The global weights are now `version`: refreshed from them when that is due (dqn)."""
        if self.every is not None and version - (self.version or 0) >= self.every:
            self._set(net.snapshot(), version)

    def take(self, vector: torch.Tensor, version: int) -> None:
        """The learner's target network, of `version` (apex)."""
        if self.kept:
            self._set(vector.detach().to(torch.float32).clone(), version)

    def body(self, net: FlatNetwork) -> tuple[bytes, int]:
        """The target's weights in the run's wire dtype (made once per target version), and its
        version. StateConflict when the run has none."""
        if self.vector is None or self.version is None:
            raise StateConflict(
                "this run has no target network: only algo 'dqn' and 'apex' runs keep one"
            )
        if self._encoded is None or self._encoded[0] != self.version:
            self._encoded = (self.version, net.wire.encode(self.vector))
        return self._encoded[1], self._encoded[0]

    def blob(self, net: FlatNetwork) -> bytes | None:
        """What the run folder keeps of it (float32), or None without one."""
        return net.layout.encode(self.vector) if self.vector is not None else None

    def restore(
        self,
        net: FlatNetwork,
        version: int,
        kept: bool,
        every: int | None,
        saved: torch.Tensor | None,
        saved_version: int | None,
    ) -> None:
        """Take up a saved run's target: the saved one, or (saved before targets were) the
        run's weights of `version`."""
        self.reset(net, version, kept, every)
        if kept and saved is not None and saved_version is not None:
            self._set(saved, saved_version)
