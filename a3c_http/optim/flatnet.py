"""A network whose parameters and buffers live in one float32 vector, and the optimizer that steps
it: the master's global network (the parameter server's), and every learner's: the learner
process beside the master (a3c_http/algos/learner.py) and the single-process learner.

The model's tensors become views of `flat`, laid out as `wire.Layout` says (parameters first), so
a weights body is the layout's header and one copy of `flat` (`layout`: float32, the run folder's;
`wire`: the run's `wire_dtype`, what the master and workers exchange), a gradient body decodes to
one vector whose parameter region is the gradient of `params`, and the optimizer steps `params` as
one tensor (about 5x faster than over the model's tensors one by one, docs/performance.md "The
parameter server"). The model itself still works as ever (forward, `state_dict`,
`load_state_dict` copy into the views).

A step is taken whole or not at all: one non-finite value in the optimizer's state would freeze
the weights while updates were still counted. A step whose result is not known to be finite
copies the vector and the optimizer's state aside first (into reused buffers) and is undone if it
leaves any value non-finite (`NonFiniteStep`). A step is known finite when the weights and state
are finite and the gradient was checked by the master (finite, its norm within max_grad_norm, its
statistics mergeable: master/learning/admission.py; a learner's own gradients are never taken as
checked): it then moves each weight by at most
`STEP_BOUND` learning rates (RMSprop: lr / sqrt(1 - alpha); Adam about 32 lr at the default
betas). So the network keeps a bound on its largest weight (`weight_bound`, exact when weights are
loaded, raised by that much at every step) and skips the copies and the check while the bound
stays far from float32's limit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from a3c_http.config.training import TrainConfig
from a3c_http.models.normalize import batch_problem, merge_moments
from a3c_http.optim.optimizers import make_optimizer
from a3c_http.wire.tensors import Layout

# Each step moves a weight by at most this many learning rates (see the module's docstring).
STEP_BOUND = 100.0
# A weight below this in size stays finite through any such step.
WEIGHT_BOUND_LIMIT = 1e37
# A gradient below this in size squares to a finite float32 (the optimizers' moments).
GRADIENT_LIMIT = 1e18
# The optimizers STEP_BOUND holds for, as a3c_http/algos/a3c/algorithm.py `make_optimizer`
# makes them.
_BOUNDED = (torch.optim.RMSprop, torch.optim.Adam)


class NonFiniteStep(ValueError):
    """An optimizer step (or the statistics merged with it) produced a non-finite value: it was
    undone, and the network is as it was before."""


class FlatNetwork:
    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        optimizer_state: dict[str, Any] | None = None,
        adam_eps: float = 1e-8,
    ) -> None:
        """`model`'s tensors become views of one vector, stepped by `config`'s optimizer (from
        `optimizer_state` when given; `adam_eps`: an Adam's epsilon, optimizers.py)."""
        self.model = model
        self.layout = layout = Layout.of(model)
        # What travels between the master and the workers: `layout` in the run's wire_dtype.
        self.wire = Layout.of(model, config.wire_dtype)
        self.flat = bind(model, layout)
        self.params = nn.Parameter(self.flat[: layout.n_params])
        self.optimizer = make_optimizer([self.params], config, adam_eps)
        self._statistics = layout.numel > layout.n_params  # normalising models have buffers
        if optimizer_state is not None:
            self.optimizer.load_state_dict(flat_optimizer_state(optimizer_state, layout))
        self._spare: list[torch.Tensor] = []  # where `step` keeps what it may have to undo
        self._bounded = _bounded(self.optimizer)
        self.weight_bound = self._measure_weight_bound()  # at least the size of every weight

    def _measure_weight_bound(self) -> float:
        return float(self.params.detach().abs().max()) if self.layout.n_params else 0.0

    def load(self, vector: torch.Tensor) -> None:
        """Weights and statistics from elsewhere (a worker's whole weights)."""
        with torch.no_grad():
            self.flat.copy_(vector)
        self.weight_bound = self._measure_weight_bound()

    def step(
        self, vectors: list[torch.Tensor], lr_scale: float = 1.0, checked_norm: float | None = None
    ) -> None:
        """One optimizer step on the mean of the gradient vectors' parameter regions (one vector:
        A3C's step; several: a sync round's), then the batch moments of each rollout (their buffer
        regions) merged into the running statistics (a3c_http/models/normalize.py): every worker's
        observations count. `lr_scale` multiplies the learning rate of this step only
        (master/learning/parameter_server.py: staleness_scaling). `checked_norm`: the norm of one
        gradient vector the master checked (master/learning/admission.py), whose step may be known
        finite beforehand (the module's docstring). Raises NonFiniteStep, the step undone, when a
        weight, a statistic or the optimizer's state would not be finite after it."""
        group = self.optimizer.param_groups[0]  # one group: the whole parameter region
        lr = group["lr"]
        moves = STEP_BOUND * lr * lr_scale
        known_finite = (
            self._bounded
            and checked_norm is not None
            and checked_norm < GRADIENT_LIMIT
            and len(vectors) == 1
            and self.weight_bound + moves < WEIGHT_BOUND_LIMIT
        )
        before = {} if known_finite else self._state_tensors()
        saved = [] if known_finite else self._keep(before)
        self.params.grad = (
            self.gradient(vectors[0])
            if len(vectors) == 1
            else torch.stack([self.gradient(v) for v in vectors]).mean(dim=0)
        )
        group["lr"] = lr * lr_scale
        try:
            # PlainRMSprop's step without the hook torch.optim wraps `step` in
            # (a3c_http/algos/a3c/algorithm.py)
            getattr(self.optimizer, "apply", self.optimizer.step)()
        finally:
            self.params.grad = None
            group["lr"] = lr
        if self._statistics:
            for vector in vectors:
                merge_moments(self.model, self.layout.views(vector))
        bad = None if known_finite else self.non_finite()
        if bad is None:
            self.weight_bound += moves
            return
        if self._state_tensors().keys() != before.keys():  # the first step made the state
            self.optimizer.state.pop(self.params, None)
        with torch.no_grad():
            for tensor, copy in zip(before.values(), saved, strict=True):
                tensor.copy_(copy)
        raise NonFiniteStep(
            f"this step would make {bad} non-finite: it was undone, nothing applied"
        )

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """Everything a step changes: the weights and statistics, and the optimizer's state (its
        moments and step count), by a name for messages."""
        tensors = {"the weights": self.flat}
        for key, value in self.optimizer.state.get(self.params, {}).items():
            if torch.is_tensor(value):
                tensors[f"the optimizer's {key}"] = value
        return tensors

    def _keep(self, tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Copies of `tensors` in buffers reused from step to step (the optimizer's state appears
        at its first step: the buffers follow its shapes)."""
        spare = self._spare
        if [t.shape for t in spare] != [t.shape for t in tensors.values()]:
            spare[:] = [torch.empty_like(t) for t in tensors.values()]
        with torch.no_grad():
            for copy, tensor in zip(spare, tensors.values(), strict=True):
                copy.copy_(tensor)
        return spare

    def gradient_norm(self, vector: torch.Tensor) -> float:
        """The global L2 norm of the gradients in a gradient vector (inf when it overflows)."""
        return float(torch.linalg.vector_norm(self.gradient(vector)))

    def batch_problem(self, vector: torch.Tensor, max_count: float) -> str | None:
        """What is wrong with the batch moments in a gradient vector's buffer region, or None
        (a3c_http/models/normalize.py `batch_problem`)."""
        if not self._statistics:
            return None
        return batch_problem(self.model, self.layout.views(vector), max_count)

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
        (`tensor 'obs_rms.var' of the weights`, `the optimizer's square_avg`), or None: such a
        state is never kept after a step, nor saved."""
        for name, tensor in self._state_tensors().items():
            if not _finite(tensor):
                if tensor is not self.flat:
                    return name
                bad = next(n for n, s in self.layout.slices.items() if not _finite(self.flat[s]))
                return f"tensor {bad!r} of the weights"
        return None


def non_finite_optimizer_state(state: Any, key: str = "") -> str | None:
    """The first tensor of an optimizer's state dict that holds a NaN or an infinity
    (`'exp_avg_sq' of the optimizer state`), or None; a learner's state of several optimizers
    and other tensors (nested dicts and lists) is looked through whole."""
    if torch.is_tensor(state):
        finite = not state.is_floating_point() or bool(torch.isfinite(state).all())
        return None if finite else f"{key!r} of the optimizer state"
    if not isinstance(state, dict | list | tuple):
        return None
    for name, value in state.items() if isinstance(state, dict) else enumerate(state):
        bad = non_finite_optimizer_state(value, name if isinstance(name, str) else key)
        if bad is not None:
            return bad
    return None


def _finite(tensor: torch.Tensor) -> bool:
    # A NaN or an infinity makes the sum non-finite, and a sum is half the time of numpy's
    # element-wise check; only a sum that overflows from finite values needs that check.
    if math.isfinite(float(tensor.sum())):
        return True
    return bool(np.isfinite(tensor.detach().reshape(-1).cpu().numpy()).all())


def _bounded(optimizer: torch.optim.Optimizer) -> bool:
    """Whether STEP_BOUND holds for `optimizer`'s steps: RMSprop without momentum, centring or
    weight decay, or Adam without AMSGrad or weight decay, at betas that keep beta1 below the
    square root of beta2 (their bound is (1 - b1) / sqrt(1 - b2) / (1 - b1 / sqrt(b2)))."""
    if not isinstance(optimizer, _BOUNDED) or len(optimizer.param_groups) != 1:
        return False
    group = optimizer.param_groups[0]
    if group.get("weight_decay") or group.get("momentum") or group.get("centered"):
        return False
    if isinstance(optimizer, torch.optim.RMSprop):
        return 1 / math.sqrt(1 - group["alpha"]) <= STEP_BOUND
    b1, b2 = group["betas"]
    if group.get("amsgrad") or b1 >= math.sqrt(b2):
        return False
    return (1 - b1) / math.sqrt(1 - b2) / (1 - b1 / math.sqrt(b2)) <= STEP_BOUND


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
    model's tensors one by one (an older run folder) or over the region already:
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
