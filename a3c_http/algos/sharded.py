"""The config field of the algorithms whose gradients a parameter server applies, which its
shards can apply instead (master/shards/): `a3c` and `dqn` (Gorila's own)."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator


class ShardedConfig(BaseModel):
    """A config section's `shards` (a mixin of `TrainConfig` sections)."""

    shards: int = Field(
        1,
        ge=1,
        le=16,
        description="Parameter-server shards (Gorila's, master/shards/): processes beside the "
        "master that each own a slice of the parameters and of the optimizer's state (and of "
        "a dqn run's target network); a worker stages its gradients' slices on every shard, "
        "the master admits the push once and every shard applies it, in the master's order. "
        "1: the master's own process steps the whole network. Listen on A3C_SHARDS_HOST.",
    )

    @model_validator(mode="after")
    def _shards_fit(self) -> ShardedConfig:
        if self.shards > 1 and (
            getattr(self, "normalize_obs", False) or getattr(self, "normalize_reward", False)
        ):
            raise ValueError(
                f"shards {self.shards} with normalize_obs or normalize_reward: the running "
                "statistics are merged on the master's own network, which shards do not step; "
                "use shards 1, or leave the normalisations off"
            )
        return self
