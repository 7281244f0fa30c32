"""A3C's config section: the shared fields, A3C's presets."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from a3c_http.algos.a3c.presets import PRESETS
from a3c_http.config.training import TrainConfig


class A3CConfig(TrainConfig):
    """A3C (seed 003): workers push n-step actor-critic gradients that the master applies as
    they come."""

    presets: ClassVar[dict[str, dict[str, Any]]] = PRESETS

    algo: Literal["a3c"] = Field("a3c", description="A3C: each worker's gradients applied at once.")
    shards: int = Field(
        1,
        ge=1,
        le=16,
        description="Parameter-server shards (Gorila's, master/shards/): processes beside the "
        "master that each own a slice of the parameters and of the optimizer's state; a "
        "worker stages its gradients' slices on every shard, the master admits the push once "
        "and every shard applies it, in the master's order. 1: the master's own process "
        "steps the whole network. Listen on A3C_SHARDS_HOST.",
    )

    @model_validator(mode="after")
    def _shards_fit(self) -> A3CConfig:
        if self.shards > 1 and (self.normalize_obs or self.normalize_reward):
            raise ValueError(
                f"shards {self.shards} with normalize_obs or normalize_reward: the running "
                "statistics are merged on the master's own network, which shards do not step; "
                "use shards 1, or leave the normalisations off"
            )
        return self

    @classmethod
    def algorithm(cls) -> type:
        from a3c_http.algos.a3c.algorithm import A3C

        return A3C
