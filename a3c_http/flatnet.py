"""A network whose parameters and buffers live in one float32 vector, and the optimizer that steps
it: the master's global network, and the in-process learner's.

The model's tensors become views of `flat`, laid out as `wire.Layout` says (parameters first), so:
- the weights' safetensors body is the layout's header and one copy of `flat` (a3c_http/wire.py);
- a gradient body decodes to one vector, whose parameter region is the gradient of `params`;
- the optimizer steps `params` (a view of that region) as one tensor: RMSprop on the default model
  takes 46 us so, against 215 us over its 12 tensors one by one (measured on this machine).
The model itself still works as ever (forward, `state_dict`, `load_state_dict` copy into the views).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from a3c_http.a3c import make_optimizer
from a3c_http.config import TrainConfig
from a3c_http.normalize import absorb
from a3c_http.wire import Layout


class FlatNetwork:
    def __init__(
        self, model: nn.Module, config: TrainConfig, optimizer_state: dict[str, Any] | None = None
    ) -> None:
        self.model = model
        self.layout = layout = Layout.of(model)
        self.flat = bind(model, layout)
        self.params = nn.Parameter(self.flat[: layout.n_params])
        self.optimizer = make_optimizer([self.params], config)
        self._statistics = layout.numel > layout.n_params  # normalising models have buffers
        if optimizer_state is not None:
            self.optimizer.load_state_dict(flat_optimizer_state(optimizer_state, layout))

    def step(self, vectors: list[torch.Tensor]) -> None:
        """One optimizer step on the mean of the gradient vectors' parameter regions (one vector:
        A3C's step; several: a sync round's), then the batch moments of each rollout (their
        buffer regions) merged into the running statistics (a3c_http/normalize.py): every
        worker's observations count."""
        self.params.grad = (
            self.gradient(vectors[0])
            if len(vectors) == 1
            else torch.stack([self.gradient(v) for v in vectors]).mean(dim=0)
        )
        self.optimizer.step()
        self.params.grad = None
        if self._statistics:
            for vector in vectors:
                absorb(self.model, self.layout.views(vector))

    def gradient(self, vector: torch.Tensor) -> torch.Tensor:
        """The gradients in a gradient vector: its parameter region (a view)."""
        return vector[: self.layout.n_params]

    def snapshot(self) -> torch.Tensor:
        """A copy of every weight and statistic, the bytes a weights body is made of."""
        return self.flat.clone()

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def non_finite(self) -> str | None:
        """What holds a NaN or an infinity, the weights' first such tensor or the optimizer's
        (`tensor 'obs_rms.var' of the weights`), or None: such a state must never be saved."""
        if not bool(torch.isfinite(self.flat).all()):
            bad = next(
                name
                for name, s in self.layout.slices.items()
                if not bool(torch.isfinite(self.flat[s]).all())
            )
            return f"tensor {bad!r} of the weights"
        return non_finite_optimizer_state(self.optimizer_state())


def non_finite_optimizer_state(state: dict[str, Any]) -> str | None:
    """The first entry of an optimizer's state dict that holds a NaN or an infinity
    (`'exp_avg_sq' of the optimizer state`), or None."""
    for entry in state.get("state", {}).values():
        for key, value in entry.items():
            if torch.is_tensor(value) and not bool(torch.isfinite(value).all()):
                return f"{key!r} of the optimizer state"
    return None


def bind(model: nn.Module, layout: Layout) -> torch.Tensor:
    """Make every parameter and buffer of `model` a view of one new vector in `layout`'s order
    (holding their current values), and return it: loading weights is then one copy into it."""
    flat = layout.flatten(model.state_dict()).clone()
    views = layout.views(flat)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        tensor.data = views[name]
    return flat


def flat_optimizer_state(saved: dict[str, Any], layout: Layout) -> dict[str, Any]:
    """The state of an optimizer over `layout`'s parameter region, from one saved over the
    model's tensors one by one (a run folder of an earlier version) or over the region already:
    per-element tensors are concatenated in layout order, scalars (`step`) taken from the first."""
    groups = saved["param_groups"]
    ids = [i for group in groups for i in group["params"]]
    if len(ids) == 1:
        return saved
    states = [saved["state"].get(i) for i in ids]
    state: dict[int, dict[str, Any]] = {}
    if all(states):
        state[0] = {
            key: (
                torch.cat([s[key].reshape(-1) for s in states])
                if torch.is_tensor(value) and value.dim() > 0
                else value
            )
            for key, value in states[0].items()
        }
    return {"state": state, "param_groups": [{**groups[0], "params": [0]}]}
