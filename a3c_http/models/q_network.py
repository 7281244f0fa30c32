"""The Q-network of the value-based algorithms: an encoder (config `encoder`, as the actor-critic's:
a ReLU MLP over the flattened observation, or `nature_cnn` / `small_cnn` over images), then either
one linear Q head (DQN, Mnih et al. 2015) or, `dueling`, a value and an advantage stream whose
advantages are centred on their mean (Wang et al. 2016): Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).

Only discrete action spaces have Q-values. `forward` maps observations `[B, *obs_shape]` in their
own dtype (uint8 and bool images are scaled in the encoder) to Q-values `[B, n_actions]`.

To the rest of the cluster (rollouts, evaluation, export) a Q-network acts as the actor-critic
does (`act`, `greedy`, `initial_state`): its policy is the epsilon-greedy distribution over its
Q-values (greedy with epsilon 0, what evaluation and export play), its value the highest Q-value.
A worker acts through `EpsilonGreedy`, which holds its own epsilon.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution

from a3c_http.models.encoders import ImageEncoder, UnsupportedSpace, flat, layer, mlp


class QNetwork(nn.Module):
    """Q-values of every action of a discrete action space (the module's docstring)."""

    discrete = True
    recurrent = False

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

    # The actor-critic's interface (the module's docstring).
    def initial_state(self, n: int) -> tuple[()]:
        return ()

    def act(
        self,
        obs: torch.Tensor,
        state: tuple[()] = (),
        starts: torch.Tensor | None = None,
        epsilon: float = 0.0,
        *,
        value: bool = True,
    ) -> tuple[Distribution, torch.Tensor, tuple[()]]:
        """The epsilon-greedy distribution over the actions of `[N]` observations, the highest
        Q-value of each (`value` changes nothing: it costs no layer) and the (empty) state."""
        q = self(obs)
        best = torch.nn.functional.one_hot(q.argmax(dim=-1), q.shape[-1]).to(q.dtype)
        probs = (1.0 - epsilon) * best + epsilon / q.shape[-1]
        return Categorical(probs=probs, validate_args=False), q.max(dim=-1).values, state

    @staticmethod
    def greedy(dist: Distribution) -> torch.Tensor:
        """The action of highest Q-value (of the distribution `act` gave)."""
        return dist.probs.argmax(-1)


class EpsilonGreedy:
    """A worker's acting policy: its Q-network with its own `epsilon` (changed as it anneals);
    everything else (parameters, `greedy`, ...) is the network's own."""

    def __init__(self, model: QNetwork, epsilon: float = 1.0) -> None:
        self.model = model
        self.epsilon = epsilon

    def act(self, obs: torch.Tensor, state: Any = (), starts: Any = None, **kwargs: Any) -> Any:
        return self.model.act(obs, state, starts, self.epsilon, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


__all__ = ["EpsilonGreedy", "QNetwork"]
