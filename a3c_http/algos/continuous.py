"""What the off-policy algorithms of continuous actions share (Ape-X DPG, SAC): the action Box as
their networks see it, the critics Q(s, a), the actors' n-step cut, the bounds their rollouts'
actions keep, and the learner of an actor and its critics.

Actions travel and are stored as the environment takes them (inside its Box: a deterministic or
squashed policy never leaves it); the networks work in the Box scaled to [-1, 1] (`ActionBox`), as
SB3's SAC and TD3 do. The critics are `count` MLPs side by side, one batched matrix product a
layer (`EnsembleLinear`): SAC's and TD3's twins cost about one critic's Python.

The learner (`ActorCriticLearner`) keeps the network in one flat vector (a3c_http/optim/flatnet.py)
whose parameters are the actor's then the critics': each part has its own Adam over its region of
the vector (one tensor each), the target network is a second vector moved towards the first by
`tau` every `target_update` steps (one `lerp_`), and the optimizers, the target and anything else
the algorithm keeps (SAC's entropy coefficient) are its state, which the master saves and starts a
new learner from. A step whose loss or gradients are not finite is skipped and counted.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from a3c_http.algos.dqn.loss import nstep_cut
from a3c_http.algos.replay_learner import ReplayLearner
from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import make_env
from a3c_http.envs.rollout import Rollout
from a3c_http.models.encoders import UnsupportedSpace, flat
from a3c_http.optim.flatnet import bind
from a3c_http.optim.team import SOLO, Team
from a3c_http.wire.named_tensors import Expected
from a3c_http.wire.tensors import Layout


@dataclass(frozen=True)
class ActionBox:
    """A one-dimensional Box of actions as [-1, 1] (`to_unit`, `from_unit`); its bounds are plain
    numbers, not buffers, so that the network's weights are parameters alone."""

    low: tuple[float, ...]
    high: tuple[float, ...]

    @classmethod
    def of(cls, space: gym.Space) -> ActionBox:
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise UnsupportedSpace(
                f"action space {space} is not a one-dimensional Box: these algorithms learn "
                "continuous actions (dqn and apex learn discrete ones)"
            )
        low, high = space.low.astype(float), space.high.astype(float)
        if not (abs(low) < 1e30).all() or not (abs(high) < 1e30).all():
            raise UnsupportedSpace(f"action space {space} is unbounded: a policy needs its bounds")
        return cls(tuple(low.tolist()), tuple(high.tolist()))

    @property
    def dims(self) -> int:
        return len(self.low)

    def _scale_bias(self, like: torch.Tensor) -> tuple[Any, Any]:
        """The half range and the middle: numbers where every dimension has the same (no tensor
        to make, nor for a traced export to take as a constant), else tensors like `like`."""
        scales = {(h - lo) / 2 for lo, h in zip(self.low, self.high, strict=True)}
        biases = {(h + lo) / 2 for lo, h in zip(self.low, self.high, strict=True)}
        if len(scales) == 1 and len(biases) == 1:
            return scales.pop(), biases.pop()
        low, high = like.new_tensor(self.low), like.new_tensor(self.high)  # (a trace's constants)
        return (high - low) / 2, (high + low) / 2

    def from_unit(self, unit: torch.Tensor) -> torch.Tensor:
        scale, bias = self._scale_bias(unit)
        return unit * scale + bias

    def to_unit(self, action: torch.Tensor) -> torch.Tensor:
        scale, bias = self._scale_bias(action)
        return (action - bias) / scale


def action_box(config: TrainConfig) -> tuple[int, ActionBox]:
    """The flat observation size and the action Box of the run's environment."""
    env = make_env(config.env_id, config.env_kwargs, config.preprocess, config.frame_stack)
    try:
        box = ActionBox.of(env.action_space)
        shape = env.observation_space.shape
        if not isinstance(env.observation_space, gym.spaces.Box) or shape is None:
            raise UnsupportedSpace(f"observation space {env.observation_space} is not a Box")
        return math.prod(shape), box
    finally:
        env.close()


class EnsembleLinear(nn.Module):
    """`count` linear layers side by side: `[B, in]` (the same input for all) or `[count, B, in]`
    in, `[count, B, out]` out, in one batched matrix product. Initialised as nn.Linear is."""

    def __init__(self, count: int, inp: int, out: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(inp)
        self.weight = nn.Parameter(torch.empty(count, inp, out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(count, 1, out).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.expand(self.weight.shape[0], *x.shape)
        return torch.baddbmm(self.bias, x, self.weight)


class Critics(nn.Module):
    """`count` critics Q(s, a) over the flat observation and the action in [-1, 1]; ReLU layers
    of `hidden_sizes`, as SB3's."""

    def __init__(self, count: int, obs_dim: int, act_dim: int, hidden_sizes: Sequence[int]):
        super().__init__()
        widths = [obs_dim + act_dim, *hidden_sizes, 1]
        self.layers = nn.ModuleList(
            EnsembleLinear(count, a, b) for a, b in zip(widths, widths[1:], strict=False)
        )

    def forward(self, obs: torch.Tensor, unit_action: torch.Tensor) -> torch.Tensor:
        """`[count, B]`: each critic's value of each (observation, action)."""
        x = torch.cat([flat(obs), unit_action], dim=-1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x.squeeze(-1)


def relu_mlp(inp: int, hidden_sizes: Sequence[int]) -> tuple[nn.Sequential, int]:
    """ReLU layers of `hidden_sizes` over `inp` inputs (SB3's SAC and TD3 nets), and their
    output's width."""
    layers: list[nn.Module] = []
    width = inp
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*layers), width


def nstep_extras(rollout: Rollout, config: TrainConfig) -> dict[str, torch.Tensor]:
    """The n-step cut an actor sends with its rollout (a3c_http/algos/dqn/loss.py `nstep_cut`):
    `returns`, `discounts` and `stops`, `[T, N]` each."""
    returns, discounts, stops = nstep_cut(
        rollout.rewards, rollout.terminated, rollout.truncated, config.n_step, config.gamma
    )
    return {"returns": returns, "discounts": discounts, "stops": stops}


def with_bounded_actions(expected: dict[str, Expected], box: ActionBox) -> dict[str, Expected]:
    """`expected` with its actions inside `box`: a deterministic or squashed policy's never
    leave it, and the critics learn of no other."""
    actions = expected["actions"]
    bounds = (torch.tensor(box.low), torch.tensor(box.high))
    within = f"the action space, a Box from {list(box.low)} to {list(box.high)}"
    return {**expected, "actions": Expected(actions.shape, actions.dtypes, *bounds, within)}


class ActorCriticLearner(ReplayLearner):
    """A learner of an actor and its critics (the module's docstring). The network's parameters
    named `critic...` are the critics' region, the ones before them the actor's."""

    def __init__(
        self,
        config: TrainConfig,
        model: nn.Module,
        device: torch.device,
        optimizer_state: dict[str, Any] | None = None,
        *,
        team: Team = SOLO,
    ) -> None:
        # Its optimizers are its own, below, and step alone: its config allows one learner.
        super().__init__(config, model, device, team=team)
        names = [name for name, _ in self.model.named_parameters()]
        split = sum(
            p.numel() for name, p in self.model.named_parameters() if not name.startswith("critic")
        )
        if names != sorted(names, key=lambda n: n.startswith("critic")):
            raise ValueError("the actor's parameters must come before the critics'")
        whole = self.net.flat
        self.regions = {"actor": slice(0, split), "critic": slice(split, self.net.layout.n_params)}
        self.parts = {name: nn.Parameter(whole[region]) for name, region in self.regions.items()}
        self.optimizers = {
            name: adam([part], config.lr) for name, part in self.parts.items()
        } | self.own_optimizers()
        self.target = copy.deepcopy(self.model).requires_grad_(False)
        self.target_flat = bind(self.target, Layout.of(self.target))
        if optimizer_state is not None:
            self.restore(optimizer_state)

    # -- the steps ---------------------------------------------------------------------------

    def step_part(self, name: str, loss: torch.Tensor) -> bool:
        """Backpropagate `loss` and take one step of part `name`'s optimizer on its region of the
        gradients; False (and counted) where the loss or those gradients are not finite."""
        self._grads.zero_()
        loss.backward()
        grads = self._grads[self.regions[name]]
        if not (math.isfinite(float(loss.detach())) and math.isfinite(float(grads.norm()))):
            self.nonfinite_steps += 1
            return False
        part = self.parts[name]
        part.grad = grads
        self.optimizers[name].step()
        part.grad = None
        return True

    def frozen_critics(self) -> Any:
        """A context in which the critics take no gradients (an actor loss through them)."""
        return _NoGrad(self.model.critic)

    def update_target(self, parts: Sequence[str]) -> None:
        """Every `target_update` steps, the target's `parts` moved `tau` of the way to the
        network's (1: copied)."""
        if (self.steps + 1) % self.config.target_update:
            return
        for name in parts:
            region = self.regions[name]
            self.target_flat[region].lerp_(self.net.flat[region], self.config.tau)

    def set_learning_rate(self, lr: float) -> None:
        for optimizer in self.optimizers.values():
            for group in optimizer.param_groups:
                group["lr"] = lr

    # -- its state ---------------------------------------------------------------------------

    def optimizer_state(self) -> dict[str, Any]:
        """Every optimizer's state, the target network and the algorithm's own (`own_state`),
        on the CPU: what a new learner starts from."""
        return {
            "optimizers": {
                name: _to_cpu(optimizer.state_dict()) for name, optimizer in self.optimizers.items()
            },
            "target": self.target_flat.detach().cpu().clone(),
            **{name: value.detach().cpu().clone() for name, value in self.own_state().items()},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Take up a state `optimizer_state` made (a saved run's); a state of another kind (a
        run folder of before) is left alone, and the learner starts afresh."""
        optimizers, target = state.get("optimizers"), state.get("target")
        if not isinstance(optimizers, dict) or not torch.is_tensor(target):
            return
        if target.shape != self.target_flat.shape:
            return
        for name, optimizer in self.optimizers.items():
            if name in optimizers:
                optimizer.load_state_dict(optimizers[name])
        with torch.no_grad():
            self.target_flat.copy_(target.to(self.target_flat.device))
            for name, value in self.own_state().items():
                if torch.is_tensor(state.get(name)) and state[name].shape == value.shape:
                    value.copy_(state[name].to(value.device))

    def own_state(self) -> dict[str, torch.Tensor]:
        """The algorithm's tensors of its own that its state keeps (SAC's log entropy
        coefficient)."""
        return {}

    def own_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimizers of the algorithm's own tensors (SAC's entropy coefficient's), made
        before a saved state is taken up."""
        return {}


def adam(params: list[torch.Tensor], lr: float) -> torch.optim.Adam:
    """PyTorch's Adam, fused where it runs fused (a third of the unfused step's time on one
    region)."""
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):  # a device or a version without the fused kernel
        return torch.optim.Adam(params, lr=lr)


class _NoGrad:
    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __enter__(self) -> None:
        self.module.requires_grad_(False)

    def __exit__(self, *exc: object) -> None:
        self.module.requires_grad_(True)


def _to_cpu(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "state": {
            k: {n: (v.cpu() if torch.is_tensor(v) else v) for n, v in s.items()}
            for k, s in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }
