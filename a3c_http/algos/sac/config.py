"""SAC's config section: the off-policy fields (a3c_http/algos/offpolicy_config.py) and its
entropy coefficient's."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from a3c_http.algos.offpolicy_config import OffPolicyConfig
from a3c_http.algos.sac.presets import DEFAULTS, SAC_PRESETS


class SACConfig(OffPolicyConfig):
    """Soft Actor-Critic: actors sample a squashed Gaussian policy into the replay beside the
    master; one learner trains twin critics, the actor and the entropy coefficient."""

    defaults: ClassVar[dict[str, Any]] = DEFAULTS
    presets: ClassVar[dict[str, dict[str, Any]]] = SAC_PRESETS

    algo: Literal["sac"] = Field(
        "sac", description="Soft Actor-Critic on a replay beside the master."
    )
    auto_entropy: bool = Field(
        True,
        description="sac: learn the entropy coefficient (from entropy_coef_init, towards "
        "target_entropy: SB3's ent_coef 'auto'); false: entropy_coef, fixed.",
    )
    entropy_coef_init: float = Field(
        1.0, gt=0, le=1e6, allow_inf_nan=False, description="sac: the learned coefficient's start."
    )
    target_entropy: float | None = Field(
        None,
        allow_inf_nan=False,
        description="sac: the policy's entropy the coefficient is tuned towards; unset: minus "
        "the action dimensions, SB3's 'auto'.",
    )

    @classmethod
    def algorithm(cls) -> type:
        from a3c_http.algos.sac.algorithm import SAC

        return SAC
