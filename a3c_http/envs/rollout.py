"""Collecting `t_max` steps from a gymnasium vector environment with batched inference.

The vector environment runs in gymnasium's NEXT_STEP autoreset mode (asked for explicitly): the step
after an episode end only resets that sub-environment. Those steps are marked `valid = False` and
earn nothing; see `a3c_http.algos.a3c.algorithm` for how the loss uses the mask. The observation
after such a step begins an episode: `starts` marks it, and a recurrent policy's state is zeroed
there.

Episodes are reported with the return and length `RecordEpisodeStatistics` measured
(a3c_http/envs/make.py): the true ones, whatever the loss learns from (`clip_reward`: the sign of
each reward; `life_loss`: a lost life counted as an episode end in `terminated`, for the loss only).
Observations keep their own dtype (uint8 frames stay uint8); float ones become float32. A rollout
also keeps what the algorithms that learn from experience send (a3c_http/algos/learner.py): the
behaviour policy's log-probabilities, the version of the weights that acted, the observation after
its last step and, for Ape-X, its transitions' n-step cut and initial priorities (`extras`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torch.distributions import Categorical, Distribution, Independent, Normal

from a3c_http.envs.make import make_env
from a3c_http.models.actor_critic import ActorCritic, State
from a3c_http.models.normalize import statistics_entries


@dataclass(frozen=True)
class Episode:
    reward: float
    length: int


@dataclass
class Rollout:
    obs: torch.Tensor  # [T, N, *obs_shape], in the environment's dtype (float as float32)
    actions: torch.Tensor  # [T, N] (discrete) or [T, N, action_dim]
    # [T, N]: log pi(a|s) of each action under the policy that took it (the behaviour policy),
    # what importance ratios (PPO, V-trace) are taken against.
    log_probs: torch.Tensor
    rewards: torch.Tensor  # [T, N], what the loss learns from (clipped with clip_reward)
    # [T, N], V(obs) under the weights that acted; None as `last_value`.
    values: torch.Tensor | None
    terminated: torch.Tensor  # [T, N] bool (with life_loss, also where a life was lost)
    truncated: torch.Tensor  # [T, N] bool
    valid: torch.Tensor  # [T, N] bool: False on autoreset steps
    # [N], V of the observation after the last step; None where the collector was told its
    # algorithm does not bootstrap on the worker (a learner values the rollout itself).
    last_value: torch.Tensor | None
    # Where an observation begins an episode ([T, N] bool), and the recurrent state the rollout
    # began with (() for a feed-forward policy): the loss unrolls the policy again from it.
    starts: torch.Tensor
    state: State
    episodes: list[Episode] = field(default_factory=list)
    # Batch moments of what this rollout saw, named as the model's running-statistics buffers
    # (empty when the model normalises nothing); see a3c_http.models.normalize.
    statistics: dict[str, torch.Tensor] = field(default_factory=dict)
    # The version of the global weights that acted (what a worker last loaded; 0 before any).
    policy_version: int = 0
    # Per-step tensors ([T, N]) an algorithm adds for its learner, by their wire names (Ape-X's
    # actors: each step's n-step cut and initial priority, a3c_http/algos/apex/algorithm.py).
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    # The observation after the last step ([N, *obs_shape]) and whether it begins an episode
    # ([N] bool): what a learner that computes the values itself bootstraps from.
    last_obs: torch.Tensor | None = None
    last_start: torch.Tensor | None = None

    @property
    def num_steps(self) -> int:
        """Real environment transitions in this rollout (autoreset steps excluded)."""
        return int(self.valid.sum())


def behaviour_log_probs(dists: list[Distribution], actions: torch.Tensor) -> torch.Tensor:
    """log pi(a|s) of a rollout's actions ([T, N, ...]) under the distributions that drew them,
    one per step: one batched operation for the policies' own distributions (a categorical, a
    diagonal Gaussian), a call per step for any other."""
    first = dists[0]
    if all(type(d) is Categorical for d in dists):
        logits = torch.stack([d.logits for d in dists])  # normalised: log-probabilities
        return logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    if all(type(d) is Independent and type(d.base_dist) is Normal for d in dists):
        loc = torch.stack([d.base_dist.loc for d in dists])
        scale = torch.stack([d.base_dist.scale for d in dists])
        dims = first.reinterpreted_batch_ndims
        return Normal(loc, scale, validate_args=False).log_prob(actions).flatten(-dims).sum(-1)
    return torch.stack([d.log_prob(a) for d, a in zip(dists, actions, strict=True)])


def make_vector_env(
    env_id: str, env_kwargs: dict, num_envs: int, preprocess: str = "none", frame_stack: int = 1
) -> SyncVectorEnv:
    return SyncVectorEnv(
        [lambda: make_env(env_id, env_kwargs, preprocess, frame_stack) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.NEXT_STEP,
    )


def obs_tensor(obs: np.ndarray) -> torch.Tensor:
    """An observation batch as the network takes it: its own dtype, float as float32."""
    tensor = torch.as_tensor(obs)
    if tensor.is_floating_point() and tensor.dtype != torch.float32:
        return tensor.float()
    return tensor


class RolloutCollector:
    """Owns a vector environment and steps it with a model, keeping the episodes going on and
    the recurrent state across rollouts."""

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict,
        num_envs: int,
        seed: int | None,
        gamma: float = 0.99,
        *,
        preprocess: str = "none",
        frame_stack: int = 1,
        clip_reward: bool = False,
        life_loss: bool = False,
    ) -> None:
        self.envs = make_vector_env(env_id, env_kwargs, num_envs, preprocess, frame_stack)
        self.num_envs = num_envs
        action_space = self.envs.single_action_space
        self._clip = None
        if isinstance(action_space, gym.spaces.Box):
            self._clip = (action_space.low, action_space.high)
        obs, info = self.envs.reset(seed=seed)
        self._obs = obs
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._fresh = np.ones(num_envs, dtype=bool)  # the observation begins an episode
        self._state: State | None = None  # the policy's, made at the first step
        self.clip_reward = clip_reward
        self.life_loss = life_loss
        self._lives = info.get("lives")
        # The discounted return so far of each episode, whose spread scales rewards (as SB3's
        # VecNormalize) when the model has `ret_rms`.
        self.gamma = gamma
        self._disc_return = np.zeros(num_envs, dtype=np.float64)

    @classmethod
    def for_config(cls, config: Any, seed: int | None) -> RolloutCollector:
        """The collector of a run's config (a3c_http/config/training.py TrainConfig)."""
        return cls(
            config.env_id,
            config.env_kwargs,
            config.num_envs,
            seed,
            config.gamma,
            preprocess=config.preprocess,
            frame_stack=config.frame_stack,
            clip_reward=config.clip_reward,
            life_loss=config.life_loss,
        )

    def collect(
        self, model: ActorCritic, t_max: int, policy_version: int = 0, bootstrap: bool = True
    ) -> Rollout:
        """`t_max` steps of every environment with `model` (the weights of `policy_version`);
        `bootstrap`: with the value of each step (`values`) and of the observation after the
        last step (`last_value`); without, both None (a learner values the rollout itself)."""
        obs_buf, act_buf, rew_buf, val_buf, dists = [], [], [], [], []
        term_buf, trunc_buf, valid_buf, disc_buf, start_buf = [], [], [], [], []
        episodes: list[Episode] = []
        ret_rms = getattr(model, "ret_rms", None)
        if self._state is None:
            self._state = model.initial_state(self.num_envs)
        state0 = self._state
        for _ in range(t_max):
            obs_t, starts = obs_tensor(self._obs), torch.as_tensor(self._fresh)
            with torch.no_grad():
                dist, value, self._state = model.act(obs_t, self._state, starts, value=bootstrap)
                action = dist.sample()
            dists.append(dist)
            env_action = action.numpy()
            if self._clip is not None:
                env_action = np.clip(env_action, *self._clip)
            next_obs, reward, terminated, truncated, info = self.envs.step(env_action)
            valid = ~self._autoreset
            reward = np.where(valid, reward, 0.0)
            terminated = terminated & valid
            truncated = truncated & valid
            ended = terminated | truncated
            if "_episode" in info:
                for i in np.flatnonzero(info["_episode"]):
                    ep = info["episode"]
                    episodes.append(Episode(float(ep["r"][i]), int(ep["l"][i])))
            if self.life_loss and "lives" in info:
                lost = valid & ~ended & (info["lives"] < self._lives)
                terminated = terminated | lost
                self._lives = info["lives"]
            if self.clip_reward:
                reward = np.sign(reward)
            if ret_rms is not None:
                self._disc_return = self._disc_return * self.gamma + reward
                disc_buf.append(self._disc_return[valid])
                reward = ret_rms.scale(torch.as_tensor(reward, dtype=torch.float32)).numpy()
            self._disc_return[ended] = 0.0

            obs_buf.append(obs_t)
            start_buf.append(starts)
            act_buf.append(action)
            rew_buf.append(torch.as_tensor(reward, dtype=torch.float32))
            val_buf.append(value)
            term_buf.append(torch.as_tensor(terminated))
            trunc_buf.append(torch.as_tensor(truncated))
            valid_buf.append(torch.as_tensor(valid))
            self._fresh = self._autoreset  # the observation after an autoreset step is a first
            self._autoreset = ended
            self._obs = next_obs
        last_obs, last_start = obs_tensor(self._obs), torch.as_tensor(self._fresh)
        last_value = None
        if bootstrap:
            with torch.no_grad():
                _, last_value, _ = model.act(last_obs, self._state, last_start)
        obs, valid = torch.stack(obs_buf), torch.stack(valid_buf)
        statistics: dict[str, torch.Tensor] = {}
        if hasattr(model, "obs_rms"):
            seen = obs[valid].reshape(-1, model.obs_dim).float()
            statistics |= statistics_entries("obs_rms", seen)
        if ret_rms is not None:
            statistics |= statistics_entries("ret_rms", torch.as_tensor(np.concatenate(disc_buf)))
        return Rollout(
            obs=obs,
            actions=(actions := torch.stack(act_buf)),
            log_probs=behaviour_log_probs(dists, actions),
            rewards=torch.stack(rew_buf),
            values=torch.stack(val_buf) if bootstrap else None,
            terminated=torch.stack(term_buf),
            truncated=torch.stack(trunc_buf),
            valid=valid,
            last_value=last_value,
            episodes=episodes,
            statistics=statistics,
            starts=torch.stack(start_buf),
            state=state0,
            policy_version=policy_version,
            last_obs=last_obs,
            last_start=last_start,
        )

    def close(self) -> None:
        self.envs.close()
