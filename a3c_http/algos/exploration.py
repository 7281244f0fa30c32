"""Per-worker exploration: each worker of a run explores its own amount, as Ape-X gives each actor
its own epsilon. The master derives every worker's settings from its place in the order the run's
workers were started or joined (`derive`, the one place that rule lives, which needs no count of
workers, since workers may join at any time), sends them in `POST /start_worker` or the reply to
`POST /join`, records them in its registry and shows them in /status; the worker trains with them
(`Exploration.config_for`, `widened`).

Both knobs keep every worker on-policy, which A3C's gradient needs (Ape-X learns off-policy, so its
actors may act as they like). A worker's own entropy_coef only changes the weight of the entropy
bonus in its loss. A log-std offset widens the Gaussian the worker samples its actions from; were
the loss to score those actions under the narrower Gaussian, the gradient would belong to another
policy than the one that acted. So the offset is part of that worker's policy: its loss takes the
log-probabilities and the entropy of the same widened Gaussian. The shared mean and log_std reach
the widened Gaussian through `log_std + offset`, so each worker's gradient is the on-policy
gradient of its own policy, and the master's optimizer, taking the workers' gradients in turn,
ascends the sum of their objectives. The critic stays shared: its values estimate the returns of
the workers' policies together, so each worker bootstraps from values that are not quite its own
(a small bias that grows with the spread).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.distributions import Distribution, Independent, Normal

from a3c_http.algos.base import Algorithm
from a3c_http.config.training import MAX_LOG_STD_SPREAD, TrainConfig


class ExplorationError(ValueError):
    """Exploration settings that do not fit the environment's actions."""


class Exploration(BaseModel):
    """One worker's exploration settings (the `exploration` of `POST /start_worker`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entropy_coef: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="This worker's weight of the entropy bonus; unset: the config's entropy_coef.",
    )
    log_std_offset: float = Field(
        0.0,
        ge=0,
        le=MAX_LOG_STD_SPREAD,
        allow_inf_nan=False,
        description="Added to the log standard deviation of this worker's Gaussian policy, to "
        "act and in its loss; continuous actions only.",
    )
    epsilon: float | None = Field(
        None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="algo apex: this actor's own epsilon (Ape-X's); unset: the config's "
        "exploration schedule.",
    )

    def resolved(self, config: TrainConfig) -> Exploration:
        """Every setting filled in: what the worker trains with under `config`."""
        if self.entropy_coef is not None:
            return self
        return self.model_copy(update={"entropy_coef": config.entropy_coef})

    def config_for(self, config: TrainConfig) -> TrainConfig:
        """The worker's own copy of the config, with its entropy_coef (what its loss uses) and
        its own epsilon as its algorithm carries it (`Algorithm.own_epsilon`: an Ape-X actor's
        as a constant exploration schedule, an Ape-X DPG actor's as its noise)."""
        update: dict[str, Any] = {"entropy_coef": self.resolved(config).entropy_coef}
        if self.epsilon is not None:
            update |= type(config).algorithm().own_epsilon(self.epsilon)
        return config.model_copy(update=update)


def spread(index: int) -> float:
    """Worker `index`'s (from 0) place between the two ends of the exploration range, from its
    index alone: 0, 1, then the midpoints of the gaps so far (1/2, 1/4, 3/4, 1/8, 3/8, ...). Any
    number of the first workers covers the range about evenly, the first two its two ends, so no
    worker needs to know how many others will join."""
    if index < 0:
        raise ValueError(f"worker index {index} is negative")
    if index < 2:
        return float(index)
    level = (index - 1).bit_length() - 1  # index 2 -> 1/2; 3, 4 -> quarters; 5..8 -> eighths
    odd = 2 * (index - 1 - 2**level) + 1
    return odd / 2 ** (level + 1)


def derive(config: TrainConfig, index: int, algorithm: type[Algorithm]) -> Exploration:
    """The settings of worker `index` (from 0, in the order workers were started or joined):
    entropy_coef from the config's entropy_coef (the first worker) to entropy_coef_max (the
    second), the log-std offset from 0 to log_std_spread, at the worker's `spread`. Written as a
    weighted mean, so that the ends are exactly the config's two values. The epsilon is the run's
    `algorithm`'s at that spread (an Ape-X actor's own: the paper's for the first two, and the
    points between for the rest, however many join)."""
    share = spread(index)
    entropy_coef = config.entropy_coef
    if config.entropy_coef_max is not None:
        entropy_coef = (1.0 - share) * config.entropy_coef + share * config.entropy_coef_max
    return Exploration(
        entropy_coef=entropy_coef,
        log_std_offset=config.log_std_spread * share,
        epsilon=algorithm.epsilon_of(config, share),
    )


def check_actions(config: TrainConfig, discrete: bool) -> None:
    """Refuse log_std_spread for discrete actions, which have no standard deviation to widen."""
    if discrete and config.log_std_spread > 0:
        raise ExplorationError(
            f"log_std_spread={config.log_std_spread:g}: the actions of {config.env_id} are "
            "discrete, and log_std_spread widens the Gaussian of continuous actions only; set it "
            "to 0 (entropy_coef_max spreads exploration over the workers for any action space)"
        )


class WidenedPolicy:
    """A model whose Gaussian policy has its log standard deviation raised by `offset`: called
    like the model, it answers the widened distribution and the model's value; everything else
    (parameters, `value`, ...) is the model's own."""

    def __init__(self, model: Any, offset: float) -> None:
        self.model = model
        self.offset = offset

    def _widen(self, dist: Distribution) -> Distribution:
        if not (isinstance(dist, Independent) and isinstance(dist.base_dist, Normal)):
            raise ExplorationError(
                f"log_std_offset needs a Gaussian policy; this model's is {type(dist).__name__}"
            )
        base = dist.base_dist
        wide = Normal(base.loc, base.scale * math.exp(self.offset), validate_args=False)
        return Independent(wide, dist.reinterpreted_batch_ndims, validate_args=False)

    def __call__(self, obs: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        dist, value = self.model(obs)
        return self._widen(dist), value

    def act(self, *args: Any, **kwargs: Any) -> tuple[Distribution, torch.Tensor | None, Any]:
        dist, value, state = self.model.act(*args, **kwargs)
        return self._widen(dist), value, state

    def unroll(self, *args: Any) -> tuple[Distribution, torch.Tensor]:
        dist, value = self.model.unroll(*args)
        return self._widen(dist), value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def widened(model: Any, offset: float) -> Any:
    """The policy a worker with this log-std offset acts and learns with: the model itself when
    the offset is 0."""
    if offset == 0:
        return model
    if model.discrete:
        raise ExplorationError(
            f"log_std_offset={offset:g}: this environment's actions are discrete, and the offset "
            "widens the Gaussian of continuous actions only"
        )
    return WidenedPolicy(model, offset)
