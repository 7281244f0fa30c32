"""IMPALA's config section: its fields, defaults and presets."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from a3c_http.algos.impala.presets import DEFAULTS, IMPALA_PRESETS
from a3c_http.algos.learner_config import LearnerConfig


class ImpalaConfig(LearnerConfig):
    """IMPALA: the learner corrects the workers' lagging rollouts with V-trace."""

    defaults: ClassVar[dict[str, Any]] = DEFAULTS
    presets: ClassVar[dict[str, dict[str, Any]]] = IMPALA_PRESETS

    algo: Literal["impala"] = Field(
        "impala", description="IMPALA (V-trace) on a learner beside the master."
    )
    n_epochs: int = Field(
        10,
        ge=1,
        le=1000,
        description="Optimizer steps on each batch of rollouts (RLlib's num_epochs; V-trace "
        "corrects each for how far the policy "
        "has moved since it acted).",
    )
    minibatches: int = Field(
        1,
        ge=1,
        le=1024,
        description="Optimizer steps each pass over a batch takes, each on an equal "
        "share of its environments (RLlib's IMPALA minibatches, as a count); V-trace corrects "
        "each for the steps before it. 1: the paper's one step on the whole batch.",
    )
    vtrace_rho_bar: float = Field(
        1.0, gt=0, description="V-trace's truncation of the importance weights (rho bar)."
    )
    vtrace_c_bar: float = Field(
        1.0, gt=0, description="V-trace's truncation of the traces (c bar)."
    )
    vtrace_lambda: float = Field(
        1.0,
        ge=0,
        le=1,
        description="The traces' decay within V-trace (SEED RL's lambda_: each trace "
        "is lambda x min(c_bar, ratio)); on-policy, the targets are then TD(lambda)'s returns, "
        "as gae_lambda makes A3C's. 1: the paper's n-step targets.",
    )

    @field_validator("vtrace_rho_bar", "vtrace_c_bar", "vtrace_lambda")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @model_validator(mode="after")
    def _minibatches_fit(self) -> ImpalaConfig:
        environments = self.num_envs * self.queue_size // self.learners
        if self.minibatches > environments:
            raise ValueError(
                f"minibatches {self.minibatches} is more than the {environments} environments "
                "of a learner's batch (num_envs x queue_size, shared by the learners): each "
                "minibatch takes whole environments"
            )
        return self

    @classmethod
    def algorithm(cls) -> type:
        from a3c_http.algos.impala.algorithm import Impala

        return Impala
