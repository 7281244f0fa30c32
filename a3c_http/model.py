"""The actor-critic network: tanh torsos (shared or one per head), a policy head and a value head.

Discrete action spaces get a categorical head (logits); Box action spaces a Gaussian head with a
learned, state-independent log standard deviation. The same class serves the master (which only
holds and updates the weights) and the workers (which also act with it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from a3c_http.config import TrainConfig
from a3c_http.envs import make_env
from a3c_http.normalize import RunningMeanStd


class UnsupportedSpace(ValueError):
    """The environment's observation or action space is not one this network can handle."""


def _layer(inp: int, out: int, gain: float) -> nn.Linear:
    # Orthogonal init with per-head gains is the A2C/PPO convention (small policy gain keeps the
    # first policy near uniform; unit gain for the value head).
    layer = nn.Linear(inp, out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(inp: int, hidden_sizes: Sequence[int]) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    width = inp
    for hidden in hidden_sizes:
        layers += [_layer(width, hidden, math.sqrt(2)), nn.Tanh()]
        width = hidden
    return nn.Sequential(*layers), width


class ActorCritic(nn.Module):
    """Policy and value networks over one observation.

    shared_torso: one tanh MLP feeds both heads (the A3C paper's network); otherwise the policy and
    the value each have their own (SB3's A2C and PPO default), so the value loss does not pull on
    the policy's features. normalize_obs / normalize_reward add running statistics as buffers
    (`obs_rms`, `ret_rms`, see a3c_http.normalize): observations are normalised inside `forward`,
    so every holder of the weights (workers, evaluation, a resumed run) sees the same inputs.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        discrete: bool,
        hidden_sizes: Sequence[int] = (64, 64),
        shared_torso: bool = False,
        log_std_init: float = 0.0,
        normalize_obs: bool = False,
        normalize_reward: bool = False,
    ) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.discrete = discrete
        if normalize_obs:
            self.obs_rms = RunningMeanStd((obs_dim,))
        if normalize_reward:
            self.ret_rms = RunningMeanStd(())
        if shared_torso:
            self.torso, width = _mlp(obs_dim, hidden_sizes)
        else:
            self.policy_torso, width = _mlp(obs_dim, hidden_sizes)
            self.value_torso, _ = _mlp(obs_dim, hidden_sizes)
        self.policy_head = _layer(width, action_dim, 0.01)
        self.value_head = _layer(width, 1, 1.0)
        if not discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def _inputs(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.reshape(obs.shape[0], -1)
        return self.obs_rms.normalize(obs) if hasattr(self, "obs_rms") else obs

    def _features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if hasattr(self, "torso"):
            shared = self.torso(x)
            return shared, shared
        return self.policy_torso(x), self.value_torso(x)

    @classmethod
    def for_spaces(
        cls,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: Sequence[int],
        **options: Any,
    ) -> ActorCritic:
        if not isinstance(observation_space, gym.spaces.Box):
            raise UnsupportedSpace(
                f"observation space {observation_space} is not a Box; only Box observations "
                "are supported"
            )
        obs_dim = int(np.prod(observation_space.shape))
        if isinstance(action_space, gym.spaces.Discrete):
            return cls(obs_dim, int(action_space.n), True, hidden_sizes, **options)
        if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            return cls(obs_dim, int(action_space.shape[0]), False, hidden_sizes, **options)
        raise UnsupportedSpace(
            f"action space {action_space} is neither Discrete nor a one-dimensional Box"
        )

    def forward(self, obs: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        """The action distribution and the state value for a batch of observations."""
        pi_features, v_features = self._features(self._inputs(obs))
        value = self.value_head(v_features).squeeze(-1)
        out = self.policy_head(pi_features)
        # No argument checks: the network's own outputs always fit, and the checks cost a tenth
        # of a rollout's time. A diverged network still shows: its gradients are not finite, and
        # the master refuses them (422).
        if self.discrete:
            return Categorical(logits=out, validate_args=False), value
        std = self.log_std.clamp(-20.0, 2.0).exp().expand_as(out)
        # Independent sums log-probabilities and entropies over the action dimensions.
        return Independent(Normal(out, std, validate_args=False), 1, validate_args=False), value

    def greedy_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action of evaluation: the most likely one, or the Gaussian's mean."""
        dist, _ = self(obs)
        return dist.probs.argmax(-1) if self.discrete else dist.mean

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        x = self._inputs(obs)
        features = self.torso(x) if hasattr(self, "torso") else self.value_torso(x)
        return self.value_head(features).squeeze(-1)


def model_for(config: TrainConfig) -> ActorCritic:
    """The network a training config describes (the master, the workers and evaluation all build
    it here, so they agree on every name and shape)."""
    return build_model(
        config.env_id,
        config.env_kwargs,
        config.hidden_sizes,
        shared_torso=config.shared_torso,
        log_std_init=config.log_std_init,
        normalize_obs=config.normalize_obs,
        normalize_reward=config.normalize_reward,
    )


def build_model(
    env_id: str, env_kwargs: dict, hidden_sizes: Sequence[int], **options: Any
) -> ActorCritic:
    """The network for an environment, sized from a throwaway instance of it; `options` go to
    ActorCritic."""
    env = make_env(env_id, env_kwargs)
    try:
        return ActorCritic.for_spaces(
            env.observation_space, env.action_space, hidden_sizes, **options
        )
    finally:
        env.close()
