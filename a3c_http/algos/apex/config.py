"""Ape-X DQN's config section: the value-based fields (a3c_http/algos/dqn/config.py), the
learner's (a3c_http/algos/learner_config.py), and its actors' epsilons and prioritized replay."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from a3c_http.algos.apex.presets import APEX_PRESETS, DEFAULTS
from a3c_http.algos.dqn.config import ValueBasedConfig
from a3c_http.algos.learner_config import LearnerConfig


class ApexConfig(ValueBasedConfig, LearnerConfig):
    """Ape-X DQN (seed 004): actors with their own epsilons push prioritized n-step transitions to
    the replay beside the master, which one learner samples."""

    defaults: ClassVar[dict[str, Any]] = DEFAULTS
    presets: ClassVar[dict[str, dict[str, Any]]] = APEX_PRESETS

    algo: Literal["apex"] = Field(
        "apex",
        description="Ape-X DQN: actors push prioritized transitions to the learner's replay.",
    )
    apex_epsilon: float = Field(
        0.4,
        gt=0,
        lt=1,
        description="Worker k acts with epsilon apex_epsilon^(1 + apex_epsilon_alpha * "
        "s(k)), s(k) = 0, 1, 1/2, 1/4, 3/4, ... its place among the workers (as "
        "entropy_coef_max spreads): Ape-X's 0.4^(1 + 7 i / (N - 1)) for any number of workers.",
    )
    apex_epsilon_alpha: float = Field(
        7.0, ge=0, le=100, description="The exponent's spread (see apex_epsilon)."
    )
    prioritized_alpha: float = Field(
        0.6,
        ge=0,
        le=1,
        description="How much the priorities shape sampling (0: uniform).",
    )
    prioritized_beta: float = Field(
        0.4,
        ge=0,
        le=1,
        description="The importance weights' exponent at the start, annealed linearly "
        "to 1 as env steps approach max_steps.",
    )

    @classmethod
    def algorithm(cls) -> type:
        from a3c_http.algos.apex.algorithm import ApexActor

        return ApexActor
