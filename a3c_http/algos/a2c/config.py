"""Sync A2C's config section: the shared fields, A3C's presets."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from a3c_http.algos.a3c.presets import PRESETS
from a3c_http.config.training import TrainConfig


class A2CConfig(TrainConfig):
    """Sync A2C across machines: each round, the master applies the mean of one gradient of
    each running worker."""

    presets: ClassVar[dict[str, dict[str, Any]]] = PRESETS

    algo: Literal["a2c"] = Field(
        "a2c", description="Sync A2C across machines: the mean of one gradient a worker and round."
    )

    @model_validator(mode="after")
    def _sync_timeout_fits(self) -> A2CConfig:
        if self.sync_timeout_s >= self.heartbeat_timeout_s:
            raise ValueError(
                "sync_timeout_s must be below heartbeat_timeout_s with algo a2c, or a worker "
                "waiting for its round would be marked lost"
            )
        return self

    @classmethod
    def algorithm(cls) -> type:
        from a3c_http.algos.a2c.algorithm import SyncA2C

        return SyncA2C
