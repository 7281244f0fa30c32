"""The original design's config section: the shared fields, A3C's presets."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from a3c_http.algos.a3c.presets import PRESETS
from a3c_http.config.training import TrainConfig


class BestWeightsConfig(TrainConfig):
    """The original design (seed 003): a worker whose episode beats the best score pushes its
    weights."""

    presets: ClassVar[dict[str, dict[str, Any]]] = PRESETS

    algo: Literal["best_weights"] = Field(
        "best_weights",
        description="The original design: workers learn on their own and push their weights "
        "after a record.",
    )

    @classmethod
    def algorithm(cls) -> type:
        from a3c_http.algos.best_weights.algorithm import BestWeights

        return BestWeights
