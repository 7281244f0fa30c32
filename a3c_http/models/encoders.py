"""What turns an observation into features (config `encoder`): a tanh MLP over the flattened
observation, or a convolutional network over an image.

- `nature_cnn`: the DQN paper's network (Mnih et al. 2015), the A3C paper's and SB3's `NatureCNN`:
  32 8x8 filters, stride 4; 64 4x4, stride 2; 64 3x3, stride 1; 512 units, all ReLU. For 84x84
  frames stacked 4 it holds about 1.7 million parameters.
- `small_cnn`: the MinAtar paper's (Young and Tian 2019): 16 3x3 filters, stride 1; 128 units.

Images arrive channels first (`FrameStackObservation` of grayscale frames: `[4, 84, 84]`) or
channels last (MinAtar's `[10, 10, C]`, RGB frames `[H, W, 3]`): a 3-D observation whose first
dimension is smaller than its last is channels first, any other channels last. Stacked
multi-channel frames (`FrameStackObservation` of MinAtar's grids: `[k, 10, 10, C]`) are 4-D: the
rule applies to one frame, and the k frames' channels are put side by side, k * C of them. uint8
images are scaled to [0, 1] and bool ones cast, in the network, so that rollouts keep and ship
them as they come (a stacked Atari observation is 28 KB as uint8, 113 KB as float32). Weights are
initialised as SB3 and CleanRL do: orthogonal, gain sqrt(2), zero biases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class UnsupportedSpace(ValueError):
    """The environment's observation or action space is not one this network can handle."""


def layer(inp: int, out: int, gain: float) -> nn.Linear:
    # Orthogonal init with per-head gains is the A2C/PPO convention (small policy gain keeps the
    # first policy near uniform; unit gain for the value head).
    linear = nn.Linear(inp, out)
    nn.init.orthogonal_(linear.weight, gain)
    nn.init.zeros_(linear.bias)
    return linear


def mlp(
    inp: int, hidden_sizes: Sequence[int], activation: type[nn.Module] = nn.Tanh
) -> tuple[nn.Sequential, int]:
    """Layers of `hidden_sizes` over `inp` inputs (tanh, as A2C and PPO, or `activation`), and
    the width of their output."""
    layers: list[nn.Module] = []
    width = inp
    for hidden in hidden_sizes:
        layers += [layer(width, hidden, math.sqrt(2)), activation()]
        width = hidden
    return nn.Sequential(*layers), width


def flat(obs: torch.Tensor) -> torch.Tensor:
    """What the `mlp` encoder reads: each observation of `[B, *obs_shape]` flattened, as float32."""
    x = obs.reshape(obs.shape[0], -1)
    return x if x.dtype == torch.float32 else x.float()


def _conv(inp: int, out: int, kernel: int, stride: int) -> nn.Conv2d:
    conv = nn.Conv2d(inp, out, kernel, stride)
    nn.init.orthogonal_(conv.weight, math.sqrt(2))
    nn.init.zeros_(conv.bias)
    return conv


# name -> (convolutions as (filters, kernel, stride), units of the dense layer after them)
CNNS: dict[str, tuple[tuple[tuple[int, int, int], ...], int]] = {
    "nature_cnn": (((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512),
    "small_cnn": (((16, 3, 1),), 128),
}


def channels_last(shape: Sequence[int]) -> bool:
    """Whether a 3-D image observation of `shape` holds its channels last (the module's rule)."""
    return not shape[0] < shape[-1]


class ImageEncoder(nn.Module):
    """A CNN of `CNNS` over one image layout: scales, puts channels first, convolves, flattens
    and applies the dense layer."""

    def __init__(self, name: str, obs_shape: Sequence[int]) -> None:
        super().__init__()
        if len(obs_shape) not in (3, 4):
            raise UnsupportedSpace(
                f"encoder {name!r} needs image observations (a 3-D Box such as 84x84 frames "
                f"stacked 4, or MinAtar's 10x10 grids, or a 4-D stack of such grids); these are "
                f"of shape {tuple(obs_shape)}: use encoder 'mlp'"
            )
        frame = tuple(obs_shape[-3:])
        self.stack = obs_shape[0] if len(obs_shape) == 4 else 0
        self.channels_last = channels_last(frame)
        channels = (frame[-1] if self.channels_last else frame[0]) * max(self.stack, 1)
        convs, units = CNNS[name]
        layers: list[nn.Module] = []
        for filters, kernel, stride in convs:
            layers += [_conv(channels, filters, kernel, stride), nn.ReLU()]
            channels = filters
        self.convs = nn.Sequential(*layers, nn.Flatten())
        probe = torch.zeros(1, *obs_shape)
        try:
            with torch.no_grad():
                flat = self.convs(self._channels_first(probe)).shape[1]
        except RuntimeError:
            raise UnsupportedSpace(
                f"encoder {name!r}: images of shape {tuple(obs_shape)} are too small for its "
                f"convolutions {convs} (filters, kernel, stride)"
            ) from None
        self.dense = nn.Sequential(layer(flat, units, math.sqrt(2)), nn.ReLU())
        self.width = units

    def _channels_first(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.dtype == torch.uint8:
            obs = obs.float().div_(255.0)
        elif not obs.is_floating_point():
            obs = obs.float()
        if self.stack:  # [B, k, H, W, C] or [B, k, C, H, W] -> [B, k * C, H, W]
            if self.channels_last:
                obs = obs.permute(0, 1, 4, 2, 3)
            return obs.reshape(obs.shape[0], -1, *obs.shape[-2:])
        # contiguous: a convolution and its backward pass on a permuted view cost a third more
        return obs.permute(0, 3, 1, 2).contiguous() if self.channels_last else obs

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.dense(self.convs(self._channels_first(obs)))
