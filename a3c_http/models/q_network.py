"""The Q-network of the value-based algorithms: an encoder (config `encoder`, as the actor-critic's:
a ReLU MLP over the flattened observation, or `nature_cnn` / `small_cnn` over images), then either
one linear Q head (DQN, Mnih et al. 2015) or, `dueling`, a value and an advantage stream whose
advantages are centred on their mean (Wang et al. 2016): Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).

Only discrete action spaces have Q-values. `forward` maps observations `[B, *obs_shape]` in their
own dtype (uint8 and bool images are scaled in the encoder) to Q-values `[B, n_actions]`.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from a3c_http.models.encoders import ImageEncoder, UnsupportedSpace, flat, layer, mlp


class QNetwork(nn.Module):
    """Q-values of every action of a discrete action space (the module's docstring)."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        n_actions: int,
        hidden_sizes: Sequence[int] = (64, 64),
        encoder: str = "mlp",
        dueling: bool = False,
    ) -> None:
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.n_actions = n_actions
        self.dueling = dueling
        width = int(np.prod(self.obs_shape))
        if encoder != "mlp":
            self.encoder = ImageEncoder(encoder, self.obs_shape)
            width = self.encoder.width
        self.torso, width = mlp(width, hidden_sizes, nn.ReLU)
        self.q_head = layer(width, n_actions, 1.0)
        if dueling:
            self.value_head = layer(width, 1, 1.0)

    @classmethod
    def for_spaces(
        cls, observation_space: gym.Space, action_space: gym.Space, **options: object
    ) -> QNetwork:
        if not isinstance(observation_space, gym.spaces.Box):
            raise UnsupportedSpace(
                f"observation space {observation_space} is not a Box; only Box observations "
                "are supported"
            )
        if not isinstance(action_space, gym.spaces.Discrete):
            raise UnsupportedSpace(
                f"action space {action_space} is not Discrete: Q-values need a finite set of "
                "actions (use ppo, impala or a3c for continuous actions)"
            )
        shape = tuple(int(n) for n in observation_space.shape)
        return cls(shape, int(action_space.n), **options)  # type: ignore[arg-type]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.torso(self.encoder(obs) if hasattr(self, "encoder") else flat(obs))
        q = self.q_head(x)
        if self.dueling:
            q = self.value_head(x) + q - q.mean(dim=-1, keepdim=True)
        return q

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The actions of highest Q-value, `[B]`."""
        with torch.no_grad():
            return self(obs).argmax(dim=-1)


def epsilon_greedy(q: torch.Tensor, epsilon: torch.Tensor | float) -> torch.Tensor:
    """Actions `[B]` from Q-values `[B, A]`: uniformly random with probability `epsilon` (one
    value, or one per row), else greedy."""
    greedy = q.argmax(dim=-1)
    random = torch.randint(q.shape[-1], greedy.shape, device=q.device)
    explore = torch.rand(greedy.shape, device=q.device) < epsilon
    return torch.where(explore, random, greedy)


def apex_epsilons(n: int, base: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Ape-X's exploration of `n` actors (Horgan et al. 2018): epsilon_i = base^(1 + alpha i /
    (n - 1)), from 0.4 down to 0.4^8 (about 0.00066); one actor gets `base`."""
    if n == 1:
        return [base]
    return [base ** (1 + alpha * i / (n - 1)) for i in range(n)]


__all__ = ["QNetwork", "apex_epsilons", "epsilon_greedy"]
