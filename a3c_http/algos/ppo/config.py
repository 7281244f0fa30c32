"""PPO's config section: its fields, defaults and presets."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from a3c_http.algos.learner_config import LearnerConfig
from a3c_http.algos.ppo.presets import DEFAULTS, PPO_PRESETS


class PPOConfig(LearnerConfig):
    """Distributed PPO (seed 002): workers fill a queue that one learner takes in epochs of
    clipped-surrogate minibatches."""

    defaults: ClassVar[dict[str, Any]] = DEFAULTS
    presets: ClassVar[dict[str, dict[str, Any]]] = PPO_PRESETS

    algo: Literal["ppo"] = Field(
        "ppo", description="Distributed PPO on a learner beside the master."
    )
    n_epochs: int = Field(
        10,
        ge=1,
        le=1000,
        description="Passes over each update's rollouts.",
    )
    batch_size: int = Field(
        64,
        ge=1,
        le=1_000_000,
        description="Steps in one minibatch (the last of an epoch may be smaller). A "
        "recurrent policy's minibatches are whole environments' sequences of about as many steps.",
    )
    clip_range: float = Field(
        0.2, gt=0, le=10, description="The clipping of the probability ratio."
    )
    clip_range_schedule: Literal["constant", "linear"] = Field(
        "constant",
        description="linear makes clip_range fall to 0 as env steps approach max_steps (the "
        "RL Zoo's lin_0.2).",
    )
    clip_range_vf: float | None = Field(
        None,
        gt=0,
        description="Clip the new value estimates to this distance from the old ones in "
        "the value loss (SB3's clip_range_vf); null: no value clipping.",
    )
    normalize_advantage: bool = Field(
        True, description="Normalise the advantages of each minibatch."
    )

    @field_validator("clip_range", "clip_range_vf")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @classmethod
    def algorithm(cls) -> type:
        from a3c_http.algos.ppo.algorithm import PPO

        return PPO
