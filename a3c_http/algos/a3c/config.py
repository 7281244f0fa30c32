"""A3C's config section: the shared fields, A3C's presets."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from a3c_http.algos.a3c.presets import PRESETS
from a3c_http.algos.sharded import ShardedConfig
from a3c_http.config.training import TrainConfig


class A3CConfig(TrainConfig, ShardedConfig):
    """A3C (seed 003): workers push n-step actor-critic gradients that the master applies as
    they come."""

    presets: ClassVar[dict[str, dict[str, Any]]] = PRESETS

    algo: Literal["a3c"] = Field("a3c", description="A3C: each worker's gradients applied at once.")

    @classmethod
    def algorithm(cls) -> type:
        from a3c_http.algos.a3c.algorithm import A3C

        return A3C
