"""Running mean and variance that several processes build together.

Each worker measures the observations (and the discounted returns) of its own rollouts and sends
those batch moments with its gradients; the master merges them into the global statistics with the
parallel-variance formula (Chan et al.) and ships the result inside the weights: the statistics are
buffers of the network, so they are saved with the run, sent with every weights reply and loaded
by evaluation, exactly as the parameters are.
"""

from __future__ import annotations

import torch
from torch import nn

EPSILON = 1e-8
CLIP = 10.0


class RunningMeanStd(nn.Module):
    """Mean, variance and count of every sample seen (buffers, so they travel in `state_dict`)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        # A tiny prior count (as SB3's VecNormalize) keeps the first merge well defined.
        self.register_buffer("count", torch.tensor(1e-4))

    @torch.no_grad()
    def merge(self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor) -> None:
        """Fold in the moments of `count` new samples."""
        n = float(count)
        if n <= 0:
            return
        total = float(self.count) + n
        delta = mean - self.mean
        m2 = self.var * float(self.count) + var * n + delta.pow(2) * float(self.count) * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
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


def absorb(model: nn.Module, entries: dict[str, torch.Tensor]) -> None:
    """Merge the batch moments of `entries` into every RunningMeanStd of `model`."""
    for prefix, module in model.named_modules():
        if isinstance(module, RunningMeanStd):
            module.merge(
                entries[f"{prefix}.mean"], entries[f"{prefix}.var"], entries[f"{prefix}.count"]
            )
