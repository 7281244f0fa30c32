"""The A3C maths: advantages, returns and the entropy-regularised actor-critic loss.

Nothing here knows about HTTP or environments: it takes tensors laid out as `[t_max, num_envs]`
and is tested with tensors alone.

How episode ends are encoded (gymnasium's NEXT_STEP autoreset): the step that ends an episode
(`terminated` or `truncated`) returns the episode's *last* observation; the following step of that
sub-environment only resets it, ignores the action and is not a transition. Such steps carry
`valid = False` and are left out of the loss. Because the step after a truncation observes the
episode's last observation, its (masked) value estimate is exactly the bootstrap value the
truncated step needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributions import Distribution

from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import Rollout
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.server import tuning


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


def gradients(
    model: nn.Module, loss: torch.Tensor, max_grad_norm: float
) -> tuple[dict[str, torch.Tensor], float]:
    """Backpropagate `loss`, clip to `max_grad_norm` and return the gradients by parameter name
    (zeros for parameters the loss does not reach, so every push has the same names) and their
    global L2 norm before clipping."""
    model.zero_grad(set_to_none=True)
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    grads = {
        name: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        for name, p in model.named_parameters()
    }
    return grads, float(norm)


class PlainRMSprop(torch.optim.RMSprop):
    """torch's RMSprop in its plain form (no momentum, not centred, no weight decay, not
    maximising: what `make_optimizer` makes), without the dispatch torch.optim puts around it
    (foreach and compile paths, grad-mode and device checks). `apply` is the step without the
    hook torch.optim wraps every optimizer's `step` in (the profiler's record and the step
    hooks), which the master calls (a3c_http/optim/flatnet.py).

    The step is torch's fused Adagrad kernel where a3c_http/server/tuning.py's `rmsprop_step` takes
    it (RMSprop's maths in one pass over the tensors, equal up to float32 rounding: 0.45 ms a step
    of a million parameters against 0.91). Otherwise (A3C_TUNING=off, tensors the kernel cannot
    take: not contiguous, another device or dtype) torch's operations one by one, bit for bit
    torch's RMSprop. Its state has RMSprop's names: it saves and loads as torch's. `RMSpropTF` is
    the same loop with TensorFlow's two differences, step by step."""

    _fusable = True  # the step may be Adagrad's fused kernel's (tuning.rmsprop_step)

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        for group in self.param_groups:
            if group["momentum"] or group["centered"] or group["weight_decay"] or group["maximize"]:
                raise ValueError(f"{type(self).__name__} takes only RMSprop's plain form")

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.apply()

    @torch.no_grad()
    def apply(self) -> None:
        for group in self.param_groups:
            alpha, eps, lr = group["alpha"], group["eps"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["square_avg"] = self._first_square_avg(p)
                state["step"] += 1
                square_avg = state["square_avg"]
                if self._fusable and tuning.rmsprop_step(
                    p, square_avg, state["step"], alpha, eps, lr
                ):
                    continue
                square_avg.mul_(alpha).addcmul_(p.grad, p.grad, value=1 - alpha)
                p.addcdiv_(p.grad, self._denominator(square_avg, eps), value=-lr)

    @staticmethod
    def _first_square_avg(p: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(p, memory_format=torch.preserve_format)

    @staticmethod
    def _denominator(square_avg: torch.Tensor, eps: float) -> torch.Tensor:
        return square_avg.sqrt().add_(eps)


class RMSpropTF(PlainRMSprop):
    """RMSprop as TensorFlow has it, which the A3C and DQN papers' Atari results and SB3's
    `RMSpropTFLike` (the RL Zoo's Atari A2C) use: the mean square starts at ones, not zeros, so
    the first steps are small while it learns the gradients' size, and `eps` is added under the
    square root (sqrt(v + 1e-5) >= 0.003), not after it. Only the plain form; its state has
    RMSprop's names, so it saves and loads as RMSprop. A step moves a weight by at most
    lr / sqrt(1 - alpha), as RMSprop's (a3c_http/optim/flatnet.py)."""

    _fusable = False  # Adagrad's kernel adds eps after the root, TensorFlow's form under it

    @staticmethod
    def _first_square_avg(p: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(p)

    @staticmethod
    def _denominator(square_avg: torch.Tensor, eps: float) -> torch.Tensor:
        return square_avg.add(eps).sqrt_()


def make_optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer of `config`: RMSprop with SB3's A2C settings (alpha 0.99, eps 1e-5:
    `PlainRMSprop`), its TensorFlow form (`RMSpropTF`) or Adam, which steps float32 tensors on
    the CPU with torch's fused kernel (one pass: 22 against 36 us a step of the default model as
    one tensor, 0.49 against 1.10 ms of a million parameters, timeit, this machine, idle; its
    result within float32 rounding of torch's default Adam)."""
    if config.optimizer == "adam":
        params = list(params)
        if all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params):
            try:
                return torch.optim.Adam(params, lr=config.lr, fused=True)
            except RuntimeError:  # a torch without the CPU kernel (before 2.4)
                pass
        return torch.optim.Adam(params, lr=config.lr)
    if config.optimizer == "rmsprop_tf":
        return RMSpropTF(params, lr=config.lr, alpha=0.99, eps=1e-5)
    return PlainRMSprop(params, lr=config.lr, alpha=0.99, eps=1e-5)


def learning_rate(config: TrainConfig, env_steps: int) -> float:
    """The learning rate after `env_steps` steps: constant, or falling linearly to 0 at
    max_steps."""
    if config.lr_schedule == "constant" or not config.max_steps:
        return config.lr
    return config.lr * max(0.0, 1.0 - env_steps / config.max_steps)


def lr_scale(staleness: float, scaling: str) -> float:
    """What the learning rate of an update `staleness` versions old is multiplied by.

    inverse: 1 / staleness, at least 1 (Zhang, Gupta, Lian and Liu, "Staleness-aware Async-SGD
    for Distributed Deep Learning", IJCAI 2016): a gradient computed on weights that moved on by
    s updates is given the step of one s-th, so the s updates it overlapped with and it move the
    weights about as far as one update on current weights would. Sync rounds (staleness 0) and a
    lone worker that waits for each reply take the full step.

    The learning rate is scaled, not the gradient. RMSprop and Adam divide each step by the root
    of their running average of squared gradients: a gradient divided by s would be multiplied
    back (all the more as stale gradients filled the average, until every step was full size
    again), and the average, meant to estimate the size of the gradients, would mix sizes that
    depend on the workers' timing. With the learning rate scaled, the average sees every gradient
    as computed and this step alone is one s-th. With RMSprop (no momentum, ours) that is exactly
    the step of a learning rate lr / s; with Adam the step also carries the momentum of earlier
    gradients, which is scaled with it for this step: an approximation that errs towards smaller
    steps.
    """
    if scaling == "inverse":
        return 1.0 / max(1.0, staleness)
    return 1.0


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
