"""The DQN loss in one place, for asynchronous DQN, Gorila and Ape-X alike: n-step transitions cut
from rollouts, and the Huber loss of Q(s, a) against a target network's bootstrapped return,
double DQN as an option, weighted per sample for a prioritized replay.

Episode ends are read as the rollouts encode them (a3c_http/envs/rollout.py, gymnasium's NEXT_STEP
autoreset): after a step that ends an episode comes one step that is not a transition (`valid`
False), and the observation after the ending step is the episode's last. An n-step transition
stops at an episode's end: a termination bootstraps from nothing, a truncation (a time limit) from
the value of that last observation, as the A3C loss does. A transition that reaches the end of
its rollout before n steps bootstraps from where it stopped, with the discount of the steps it took.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class Transitions:
    """n-step transitions, flat `[B]` along the first dimension."""

    obs: torch.Tensor  # [B, *obs_shape], the observation the action was taken in
    actions: torch.Tensor  # [B] int64 (a discrete action), or [B, action dims] (a Box's)
    returns: torch.Tensor  # [B], the discounted sum of up to n rewards
    next_obs: torch.Tensor  # [B, *obs_shape], the observation to bootstrap from
    discounts: torch.Tensor  # [B], gamma^m for m steps taken, 0 where the episode terminated


def nstep_transitions(
    obs: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    valid: torch.Tensor,
    last_obs: torch.Tensor,
    n: int,
    gamma: float,
) -> Transitions:
    """The n-step transitions of a rollout's `[T, N]` steps (`obs` `[T, N, *obs_shape]`,
    `last_obs` `[N, *obs_shape]` the observation after the last step), one per valid step, in
    time-major order: `nstep_cut`, then `cut_transitions`."""
    returns, discounts, stops = nstep_cut(rewards, terminated, truncated, n, gamma)
    return cut_transitions(obs, actions, valid, last_obs, returns, discounts, stops)


def nstep_cut(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    n: int,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where each step's n-step transition ends, `[T, N]` each: its return (the discounted sum
    of up to n rewards), its discount (gamma^m for the m steps it took, 0 where the episode
    terminated) and the index in `[1, T]` of the observation it bootstraps from (T: the one
    after the rollout's last step)."""
    steps, envs = rewards.shape
    returns = torch.zeros(steps, envs)
    discounts = torch.ones(steps, envs)
    stop = torch.zeros(steps, envs, dtype=torch.long)  # index of the observation to bootstrap from
    open_ = torch.ones(steps, envs, dtype=torch.bool)  # the transition still takes steps
    start = torch.arange(steps).unsqueeze(1).expand(steps, envs)
    for k in range(n):
        index = start + k
        inside = open_ & (index < steps)
        at = index.clamp(max=steps - 1)
        reward = rewards.gather(0, at).float()
        returns = returns + torch.where(inside, discounts * reward, torch.zeros(()))
        discounts = torch.where(inside, discounts * gamma, discounts)
        stop = torch.where(inside, index + 1, stop)
        ends = inside & terminated.gather(0, at)  # nothing to bootstrap from
        discounts = torch.where(ends, torch.zeros(()), discounts)
        open_ = inside & ~ends & ~truncated.gather(0, at)
    return returns, discounts, stop


def cut_transitions(
    obs: torch.Tensor,
    actions: torch.Tensor,
    valid: torch.Tensor,
    last_obs: torch.Tensor,
    returns: torch.Tensor,
    discounts: torch.Tensor,
    stops: torch.Tensor,
) -> Transitions:
    """The transitions of a rollout's valid steps from where `nstep_cut` ended them (`stops`:
    indices in `[1, T]` of `obs` followed by `last_obs`); discrete actions as int64 indices, a
    Box's as they are."""
    steps, envs = valid.shape
    following = torch.cat([obs, last_obs.unsqueeze(0)])  # [T + 1, N, ...]: index t + m
    keep = valid.reshape(-1)
    flat_stop = stops.reshape(-1)[keep]
    env_index = torch.arange(envs).repeat(steps)[keep]
    taken = actions.reshape(steps * envs, *actions.shape[2:])[keep]
    return Transitions(
        obs=obs.reshape(steps * envs, *obs.shape[2:])[keep],
        actions=taken if taken.is_floating_point() else taken.long(),
        returns=returns.reshape(-1)[keep],
        next_obs=following[flat_stop, env_index],
        discounts=discounts.reshape(-1)[keep],
    )


def dqn_loss(
    online: nn.Module,
    target: nn.Module,
    batch: Transitions,
    double: bool = True,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Huber loss of Q(s, a) against returns + discounts * Q_target(s', a*), a* the online
    network's best action at s' (`double`, van Hasselt et al. 2016) or the target's own; each
    sample weighted by `weights` (a prioritized replay's importance weights) when given.
    Returns the loss and the absolute TD errors `[B]` (detached: new priorities)."""
    q = online(batch.obs).gather(1, batch.actions.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        next_target = target(batch.next_obs)
        if double:
            best = online(batch.next_obs).argmax(dim=1, keepdim=True)
        else:
            best = next_target.argmax(dim=1, keepdim=True)
        bootstrap = next_target.gather(1, best).squeeze(1)
        y = batch.returns + batch.discounts * bootstrap
    per_sample = F.smooth_l1_loss(q, y, reduction="none")
    if weights is not None:
        per_sample = per_sample * weights
    return per_sample.mean(), (y - q).detach().abs()
