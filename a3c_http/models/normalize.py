"""Running mean and variance that several processes build together.

Each worker measures the observations (and the discounted returns) of its own rollouts and sends
those batch moments with its gradients; the master merges them into the global statistics with the
parallel-variance formula (Chan et al.) and ships the result inside the weights: the statistics are
buffers of the network, so they are saved with the run, sent with every weights reply and loaded
by evaluation, exactly as the parameters are.

The statistics are state that a peer changes, so the master judges every batch before it merges
it (`batch_problem`): a count beyond what one rollout can hold, a negative variance, or a merge
whose result would leave float32's range (a non-finite statistic would be saved and keep the run
folder from resuming).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

EPSILON = 1e-8
CLIP = 10.0
# The largest float32: a statistic beyond it would be saved as infinity.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class RunningMeanStd(nn.Module):
    """Mean, variance and count of every sample seen (buffers, so they travel in `state_dict`)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        # A tiny prior count (as SB3's VecNormalize) keeps the first merge well defined.
        self.register_buffer("count", torch.tensor(1e-4))

    def merged(
        self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The mean, variance and count after folding in the moments of `count` new samples,
        computed in float64 without changing anything (`merge` applies them)."""
        n, old = float(count), float(self.count)
        total = old + n
        mean64, own_mean = mean.double(), self.mean.double()
        delta = mean64 - own_mean
        m2 = self.var.double() * old + var.double() * n + delta.pow(2) * old * n / total
        return own_mean + delta * n / total, m2 / total, total

    @torch.no_grad()
    def merge(self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor) -> None:
        """Fold in the moments of `count` new samples."""
        if float(count) <= 0:
            return
        new_mean, new_var, total = self.merged(mean, var, count)
        self.mean.copy_(new_mean)
        self.var.copy_(new_var)
        self.count.fill_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + EPSILON)).clamp(-CLIP, CLIP)

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """Divide by the standard deviation only (rewards keep their sign and zero)."""
        return (x / torch.sqrt(self.var + EPSILON)).clamp(-CLIP, CLIP)


def moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, (population) variance and count of the samples along the first dimension."""
    x = x.to(torch.float32)
    if x.shape[0] == 0:
        zeros = torch.zeros(x.shape[1:])
        return zeros, zeros.clone(), torch.tensor(0.0)
    return x.mean(0), x.var(0, unbiased=False), torch.tensor(float(x.shape[0]))


def statistics_entries(prefix: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The moments of `x` under the buffer names of the RunningMeanStd at `prefix`, as sent in a
    gradient body."""
    mean, var, count = moments(x)
    return {f"{prefix}.mean": mean, f"{prefix}.var": var, f"{prefix}.count": count}


def merge_moments(model: nn.Module, entries: dict[str, torch.Tensor]) -> None:
    """Merge the batch moments of `entries` into every RunningMeanStd of `model`."""
    for prefix, module in model.named_modules():
        if isinstance(module, RunningMeanStd):
            module.merge(
                entries[f"{prefix}.mean"], entries[f"{prefix}.var"], entries[f"{prefix}.count"]
            )


def batch_problem(
    model: nn.Module, entries: dict[str, torch.Tensor], max_count: float
) -> str | None:
    """What is wrong with the batch moments of `entries` (a gradient push's statistics) for
    `model`'s running statistics, or None: a count below 0 or above `max_count` (the samples one
    rollout holds), a negative variance, or a merge whose result would not be finite in float32."""
    for prefix, module in model.named_modules():
        if not isinstance(module, RunningMeanStd):
            continue
        mean, var, count = (entries[f"{prefix}.{k}"] for k in ("mean", "var", "count"))
        n = float(count)
        if not 0 <= n <= max_count:
            return (
                f"{prefix}.count is {n:g}: a rollout's statistics count 0 to {max_count:g} samples "
                "(t_max x num_envs)"
            )
        if bool((var < 0).any()):
            return f"{prefix}.var holds a negative variance ({float(var.min()):g})"
        if n == 0:
            continue
        for name, value in zip(("mean", "var"), module.merged(mean, var, count)[:2], strict=True):
            if not bool(torch.isfinite(value).all()) or float(value.abs().max()) > _FLOAT32_MAX:
                return f"merging {prefix} would make its {name} leave float32's range"
    return None


def statistics_problem(model: nn.Module, entries: dict[str, torch.Tensor]) -> str | None:
    """What is wrong with whole running statistics for `model` (those of a weights body,
    `entries` by buffer name), or None: a negative count or variance (finiteness is the wire's
    check)."""
    for prefix, module in model.named_modules():
        if isinstance(module, RunningMeanStd):
            count, var = entries[f"{prefix}.count"], entries[f"{prefix}.var"]
            if float(count) < 0:
                return f"{prefix}.count is negative ({float(count):g})"
            if bool((var < 0).any()):
                return f"{prefix}.var holds a negative variance ({float(var.min()):g})"
    return None
