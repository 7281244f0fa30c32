"""A3C (algo `a3c`): each worker computes the entropy-regularised actor-critic loss of
its rollout and pushes its clipped gradients; the master applies each push at once with its one
optimizer, if it is fresh enough (`max_staleness`), and answers with the new weights.

The maths (advantages, returns, the loss) knows nothing about HTTP or environments: it takes
tensors laid out as `[t_max, num_envs]` and is tested with tensors alone.

How episode ends are encoded (gymnasium's NEXT_STEP autoreset): the step that ends an episode
(`terminated` or `truncated`) returns the episode's *last* observation; the following step of that
sub-environment only resets it, ignores the action and is not a transition. Such steps carry
`valid = False` and are left out of the loss. Because the step after a truncation observes the
episode's last observation, its (masked) value estimate is exactly the bootstrap value the
truncated step needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributions import Distribution

from a3c_http.algos.base import Algorithm, GradientUpdate, Sends, WorkerPort, gradients
from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import Rollout
from a3c_http.models.actor_critic import ActorCritic


def compute_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    last_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    valid: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(lambda) advantages and value targets for a rollout.

    rewards, values, terminated, truncated, valid: `[T, N]`; last_value: `[N]`, the value of the
    observation after the last step. With `gae_lambda = 1` the advantages are the n-step returns
    of A3C minus the values. Returns `(advantages, returns)`, both zero where `valid` is False.
    """
    steps = rewards.shape[0]
    next_values = torch.cat([values[1:], last_value.unsqueeze(0)], dim=0)
    terminated = terminated.float()
    done = torch.maximum(terminated, truncated.float())
    valid_f = valid.float()
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    for t in reversed(range(steps)):
        # A terminated episode has no future; a truncated one bootstraps from V(last observation).
        delta = rewards[t] + gamma * next_values[t] * (1.0 - terminated[t]) - values[t]
        # The chain of future advantages stops at every episode end.
        running = (delta + gamma * gae_lambda * (1.0 - done[t]) * running) * valid_f[t]
        advantages[t] = running
    returns = (advantages + values) * valid_f
    return advantages, returns


@dataclass(frozen=True)
class LossTerms:
    total: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor

    def as_floats(self) -> dict[str, float]:
        return {
            "train/loss": float(self.total.detach()),
            "train/policy_loss": float(self.policy_loss),
            "train/value_loss": float(self.value_loss),
            "train/entropy": float(self.entropy),
        }


def a3c_loss(
    dist: Distribution,
    values: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    valid: torch.Tensor,
    value_coef: float,
    entropy_coef: float,
) -> LossTerms:
    """`-log pi(a|s) * A + value_coef * (R - V(s))^2 - entropy_coef * H(pi(.|s))`, averaged over
    the valid steps. `dist` and `values` are the policy's over the whole rollout `[T, N]` in time
    order (`ActorCritic.unroll`); the autoreset steps are masked out, not gathered away, so a
    recurrent policy sees its steps as they happened. Advantages are treated as constants."""
    mask = valid.to(values.dtype)
    count = mask.sum()
    if not bool(count > 0):
        raise ValueError("the rollout has no valid step to learn from")
    log_prob = dist.log_prob(actions)
    # The true entropy of the policy distribution, not -sum(pi * logits) as the original design.
    entropy = (dist.entropy() * mask).sum() / count
    policy_loss = -(log_prob * advantages.detach() * mask).sum() / count
    value_loss = ((returns.detach() - values).pow(2) * mask).sum() / count
    total = policy_loss + value_coef * value_loss - entropy_coef * entropy
    return LossTerms(total, policy_loss.detach(), value_loss.detach(), entropy.detach())


def rollout_loss(model: ActorCritic, rollout: Rollout, cfg: TrainConfig) -> LossTerms:
    """The loss of one collected rollout under `cfg`'s coefficients."""
    advantages, returns = compute_advantages(
        rollout.rewards,
        rollout.values,
        rollout.last_value,
        rollout.terminated,
        rollout.truncated,
        rollout.valid,
        cfg.gamma,
        cfg.gae_lambda,
    )
    dist, values = model.unroll(rollout.obs, rollout.state, rollout.starts)
    return a3c_loss(
        dist,
        values,
        rollout.actions,
        advantages,
        returns,
        rollout.valid,
        cfg.value_coef,
        cfg.entropy_coef,
    )


class A3C(Algorithm):
    """Asynchronous gradients: up to `max_in_flight` pushes on the wire while the worker collects
    its next rollouts (never more than `max_staleness`, which would be refused)."""

    name = "a3c"
    sends = Sends.GRADIENTS

    def pushes_in_flight(self) -> int:
        return min(self.config.max_in_flight, self.config.max_staleness)

    def push_wait_s(self) -> float:
        """How long the master may hold a push's reply: not at all."""
        return 0.0

    def update_of(self, rollout: Rollout) -> GradientUpdate:
        """The loss of `rollout` under the policy that acted, and its clipped gradients."""
        terms = rollout_loss(self.policy, rollout, self.config)
        grads, norm = gradients(self.model, terms.total, self.config.max_grad_norm)
        return GradientUpdate(grads, float(terms.total.detach()), norm, terms.as_floats())

    def on_rollout(self, port: WorkerPort, rollout: Rollout) -> None:
        with port.learning():
            update = self.update_of(rollout)
        port.push_gradients(update, rollout, self.push_wait_s())
