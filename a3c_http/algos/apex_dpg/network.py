"""Ape-X DPG's network: a deterministic actor and one critic (two: TD3's twins), in one module
whose parameters are the actor's then the critics' (a3c_http/algos/continuous.py
`ActorCriticLearner`); and the noise each actor explores with (`NoisyPolicy`).

It acts as the cluster's other networks do (`act`, `greedy`, `initial_state`): its policy is a
point, the actor's action (`PointPolicy`), which evaluation, a3c-evaluate, a3c-export and
load_policy play; an actor adds its own Gaussian noise to it, clipped to the action Box.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from a3c_http.algos.continuous import ActionBox, Critics, relu_mlp
from a3c_http.models.encoders import flat

State = tuple[torch.Tensor, ...]


class PointPolicy:
    """A deterministic action in the Box, with Gaussian noise of `noise` (a share of the half
    range, in [-1, 1] units) when drawn, clipped to the Box. Its density is not defined: its
    log_prob is 0 (no algorithm of a deterministic policy reads it)."""

    def __init__(self, unit: torch.Tensor, box: ActionBox, noise: float = 0.0) -> None:
        self.unit, self.box, self.noise = unit, box, noise

    @property
    def mean(self) -> torch.Tensor:
        return self.box.from_unit(self.unit)

    def sample(self) -> torch.Tensor:
        with torch.no_grad():
            drawn = self.unit + self.noise * torch.randn_like(self.unit)
            return self.box.from_unit(drawn.clamp(-1.0, 1.0))

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        return torch.zeros(action.shape[:-1])


class DPGNetwork(nn.Module):
    """The actor (ReLU layers of `hidden_sizes`, then a tanh) and `critics` critics Q(s, a)."""

    discrete = False
    recurrent = False

    def __init__(
        self, obs_dim: int, box: ActionBox, hidden_sizes: Sequence[int], critics: int = 1
    ) -> None:
        super().__init__()
        self.box = box
        self.actor, width = relu_mlp(obs_dim, hidden_sizes)
        self.actor_out = nn.Linear(width, box.dims)
        self.critic = Critics(critics, obs_dim, box.dims, hidden_sizes)

    def action(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's action in [-1, 1]."""
        return torch.tanh(self.actor_out(self.actor(flat(obs))))

    def act(
        self,
        obs: torch.Tensor,
        state: State = (),
        starts: torch.Tensor | None = None,
        *,
        value: bool = True,
    ) -> tuple[PointPolicy, torch.Tensor, State]:
        """One step of `[N]` environments: the actor's action as a policy, a value of 0 (the
        critics value actions, not states; `value` changes nothing) and no state."""
        return PointPolicy(self.action(obs), self.box), torch.zeros(obs.shape[0]), ()

    def initial_state(self, n: int) -> State:
        return ()

    @staticmethod
    def greedy(dist: PointPolicy) -> torch.Tensor:
        return dist.mean


class NoisyPolicy:
    """A network whose actions an actor draws with Gaussian noise of its own scale `noise`
    (Ape-X's actors each explore their own amount); everything else is the network's."""

    def __init__(self, model: DPGNetwork, noise: float) -> None:
        self.model = model
        self.noise = noise

    def act(
        self, obs: torch.Tensor, state: State = (), starts: torch.Tensor | None = None, **kw: Any
    ) -> tuple[PointPolicy, torch.Tensor, State]:
        dist, value, state = self.model.act(obs, state, starts, **kw)
        return PointPolicy(dist.unit, dist.box, self.noise), value, state

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)
