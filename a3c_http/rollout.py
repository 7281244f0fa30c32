"""Collecting `t_max` steps from a gymnasium vector environment with batched inference.

The vector environment runs in gymnasium's NEXT_STEP autoreset mode (asked for explicitly): the
step after an episode end only resets that sub-environment. Those steps are marked `valid = False`
and earn nothing; see `a3c_http.a3c` for how the loss uses the mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from a3c_http.envs import make_env
from a3c_http.model import ActorCritic
from a3c_http.normalize import statistics_entries


@dataclass(frozen=True)
class Episode:
    reward: float
    length: int


@dataclass
class Rollout:
    obs: torch.Tensor  # [T, N, *obs_shape]
    actions: torch.Tensor  # [T, N] (discrete) or [T, N, action_dim]
    rewards: torch.Tensor  # [T, N]
    values: torch.Tensor  # [T, N], V(obs) under the weights that acted
    terminated: torch.Tensor  # [T, N] bool
    truncated: torch.Tensor  # [T, N] bool
    valid: torch.Tensor  # [T, N] bool: False on autoreset steps
    last_value: torch.Tensor  # [N], V of the observation after the last step
    episodes: list[Episode] = field(default_factory=list)
    # Batch moments of what this rollout saw, named as the model's running-statistics buffers
    # (empty when the model normalises nothing); see a3c_http.normalize.
    statistics: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        """Real environment transitions in this rollout (autoreset steps excluded)."""
        return int(self.valid.sum())


def make_vector_env(env_id: str, env_kwargs: dict, num_envs: int) -> SyncVectorEnv:
    return SyncVectorEnv(
        [lambda: make_env(env_id, env_kwargs) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.NEXT_STEP,
    )


class RolloutCollector:
    """Owns a vector environment and steps it with a model, keeping episode statistics across
    rollouts."""

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict,
        num_envs: int,
        seed: int | None,
        gamma: float = 0.99,
    ) -> None:
        self.envs = make_vector_env(env_id, env_kwargs, num_envs)
        self.num_envs = num_envs
        action_space = self.envs.single_action_space
        self._clip = None
        if isinstance(action_space, gym.spaces.Box):
            self._clip = (action_space.low, action_space.high)
        obs, _ = self.envs.reset(seed=seed)
        self._obs = obs
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._ep_return = np.zeros(num_envs, dtype=np.float64)
        self._ep_length = np.zeros(num_envs, dtype=np.int64)
        # The discounted return so far of each episode, whose spread scales rewards (as SB3's
        # VecNormalize) when the model has `ret_rms`.
        self.gamma = gamma
        self._disc_return = np.zeros(num_envs, dtype=np.float64)

    def collect(self, model: ActorCritic, t_max: int) -> Rollout:
        obs_buf, act_buf, rew_buf, val_buf = [], [], [], []
        term_buf, trunc_buf, valid_buf, disc_buf = [], [], [], []
        episodes: list[Episode] = []
        ret_rms = getattr(model, "ret_rms", None)
        for _ in range(t_max):
            obs_t = torch.as_tensor(self._obs, dtype=torch.float32)
            with torch.no_grad():
                dist, value = model(obs_t)
                action = dist.sample()
            env_action = action.numpy()
            if self._clip is not None:
                env_action = np.clip(env_action, *self._clip)
            next_obs, reward, terminated, truncated, _ = self.envs.step(env_action)
            valid = ~self._autoreset
            reward = np.where(valid, reward, 0.0)
            terminated = terminated & valid
            truncated = truncated & valid

            self._ep_return += reward
            self._ep_length += valid
            if ret_rms is not None:
                self._disc_return = self._disc_return * self.gamma + reward
                disc_buf.append(self._disc_return[valid])
                reward = ret_rms.scale(torch.as_tensor(reward, dtype=torch.float32)).numpy()
            ended = terminated | truncated
            for i in np.flatnonzero(ended):
                episodes.append(Episode(float(self._ep_return[i]), int(self._ep_length[i])))
            self._ep_return[ended] = 0.0
            self._ep_length[ended] = 0
            self._disc_return[ended] = 0.0

            obs_buf.append(obs_t)
            act_buf.append(action)
            rew_buf.append(torch.as_tensor(reward, dtype=torch.float32))
            val_buf.append(value)
            term_buf.append(torch.as_tensor(terminated))
            trunc_buf.append(torch.as_tensor(truncated))
            valid_buf.append(torch.as_tensor(valid))
            self._autoreset = ended
            self._obs = next_obs
        with torch.no_grad():
            last_value = model.value(torch.as_tensor(self._obs, dtype=torch.float32))
        obs, valid = torch.stack(obs_buf), torch.stack(valid_buf)
        statistics: dict[str, torch.Tensor] = {}
        if hasattr(model, "obs_rms"):
            statistics |= statistics_entries("obs_rms", obs[valid].reshape(-1, model.obs_dim))
        if ret_rms is not None:
            statistics |= statistics_entries("ret_rms", torch.as_tensor(np.concatenate(disc_buf)))
        return Rollout(
            obs=obs,
            actions=torch.stack(act_buf),
            rewards=torch.stack(rew_buf),
            values=torch.stack(val_buf),
            terminated=torch.stack(term_buf),
            truncated=torch.stack(trunc_buf),
            valid=valid,
            last_value=last_value,
            episodes=episodes,
            statistics=statistics,
        )

    def close(self) -> None:
        self.envs.close()
