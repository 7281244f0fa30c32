"""Ape-X DPG's config section: the off-policy fields (a3c_http/algos/offpolicy_config.py), its
actors' noise, and TD3's settings."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from a3c_http.algos.apex_dpg.presets import APEX_DPG_PRESETS, DEFAULTS
from a3c_http.algos.offpolicy_config import OffPolicyConfig


class ApexDPGConfig(OffPolicyConfig):
    """Ape-X DPG (seed 004): actors, each with its own exploration noise, push prioritized
    transitions to the replay beside the master; one learner trains a deterministic actor and its
    critic (TD3 with twin_critics, policy_delay and target_noise)."""

    defaults: ClassVar[dict[str, Any]] = DEFAULTS
    presets: ClassVar[dict[str, dict[str, Any]]] = APEX_DPG_PRESETS

    algo: Literal["apex_dpg"] = Field(
        "apex_dpg",
        description="Ape-X DPG: actors push prioritized transitions to the learner's replay.",
    )
    dpg_noise: float = Field(
        0.3,
        gt=0,
        le=1,
        description="apex_dpg: worker k adds Gaussian noise of standard deviation "
        "dpg_noise^(1 + dpg_noise_alpha * s(k)) (a share of the action Box's half range) to its "
        "actor's action, s(k) = 0, 1, 1/2, 1/4, 3/4, ... its place among the workers, as Ape-X "
        "spreads its actors' epsilons; clipped to the Box.",
    )
    dpg_noise_alpha: float = Field(
        1.5, ge=0, le=100, description="apex_dpg: the exponent's spread (see dpg_noise)."
    )
    twin_critics: bool = Field(
        False,
        description="apex_dpg: two critics, each bootstrapped from their minimum (TD3's clipped "
        "double Q-learning).",
    )
    policy_delay: int = Field(
        1,
        ge=1,
        le=1000,
        description="apex_dpg: critic steps for each actor step, which the target updates follow "
        "(TD3's 2).",
    )
    target_noise: float = Field(
        0.0,
        ge=0,
        le=10,
        description="apex_dpg: Gaussian noise on the target actor's actions (a share of the half "
        "range), clipped to target_noise_clip (TD3's target smoothing, 0.2); 0: none.",
    )
    target_noise_clip: float = Field(
        0.5, gt=0, le=10, description="apex_dpg: the clip of target_noise's draws."
    )

    @classmethod
    def algorithm(cls) -> type:
        from a3c_http.algos.apex_dpg.algorithm import ApexDPG

        return ApexDPG
