"""The optimizers a run can name (config `optimizer`) and the learning rate's schedule and
staleness scaling. The master steps its global network with one of them (a3c_http/optim/flatnet.py),
the single-process learner and a best_weights worker their own copies."""

from __future__ import annotations

from typing import Any

import torch

from a3c_http import tuning
from a3c_http.config.training import TrainConfig


class PlainRMSprop(torch.optim.RMSprop):
    """torch's RMSprop in its plain form (no momentum, not centred, no weight decay, not
    maximising: what `make_optimizer` makes), without the dispatch torch.optim puts around it
    (foreach and compile paths, grad-mode and device checks). `apply` is the step without the
    hook torch.optim wraps every optimizer's `step` in (the profiler's record and the step
    hooks), which the master calls (a3c_http/optim/flatnet.py).

    The step is torch's fused Adagrad kernel where a3c_http/tuning/'s `rmsprop_step` takes
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


def make_optimizer(
    params, config: TrainConfig, adam_eps: float = 1e-8
) -> torch.optim.Optimizer:
    """The optimizer of `config`: RMSprop with SB3's A2C settings (alpha 0.99, eps 1e-5:
    `PlainRMSprop`), its TensorFlow form (`RMSpropTF`) or Adam with `adam_eps` (torch's default;
    an algorithm's learner may ask for its own: PPO's 1e-5, as SB3's),
    which steps float32 tensors on the CPU with torch's fused kernel (one pass: 22 against 36 us
    a step of the default model as one tensor, 0.49 against 1.10 ms of a million parameters,
    timeit, this machine, idle; its result within float32 rounding of torch's default Adam)."""
    if config.optimizer == "adam":
        params = list(params)
        eps = adam_eps
        if all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params):
            try:
                return torch.optim.Adam(params, lr=config.lr, eps=eps, fused=True)
            except RuntimeError:  # a torch without the CPU kernel (before 2.4)
                pass
        return torch.optim.Adam(params, lr=config.lr, eps=eps)
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
