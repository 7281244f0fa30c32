"""The training config's fields for the learner beside the master (`algo` ppo and impala): a base
of `TrainConfig` (a3c_http/config/training.py), whose fields and validation they share."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LearnerFields(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    queue_size: int = Field(
        2,
        ge=1,
        le=1024,
        description="ppo and impala: the rollouts (t_max x num_envs steps each) one update of "
        "the learner takes. Twice as many may wait for it; beyond that a push's reply is held "
        "until there is room (the seed's bounded queue).",
    )
    max_policy_lag: int = Field(
        4,
        ge=0,
        description="ppo and impala: a rollout acted by weights more than this many versions "
        "older than the learner's is dropped when the learner takes it (counted in /status "
        "learner.dropped_stale); impala corrects the lag of the rest with V-trace.",
    )
    n_epochs: int = Field(
        10,
        ge=1,
        le=1000,
        description="ppo: passes over each update's rollouts; impala: optimizer steps on each "
        "batch of rollouts (RLlib's num_epochs; V-trace corrects each for how far the policy "
        "has moved since it acted).",
    )
    minibatches: int = Field(
        1,
        ge=1,
        le=1024,
        description="impala: optimizer steps each pass over a batch takes, each on an equal "
        "share of its environments (RLlib's IMPALA minibatches, as a count); V-trace corrects "
        "each for the steps before it. 1: the paper's one step on the whole batch.",
    )
    batch_size: int = Field(
        64,
        ge=1,
        le=1_000_000,
        description="ppo: steps in one minibatch (the last of an epoch may be smaller). A "
        "recurrent policy's minibatches are whole environments' sequences of about as many steps.",
    )
    clip_range: float = Field(
        0.2, gt=0, le=10, description="ppo: the clipping of the probability ratio."
    )
    clip_range_schedule: Literal["constant", "linear"] = Field(
        "constant",
        description="ppo: linear makes clip_range fall to 0 as env steps approach max_steps (the "
        "RL Zoo's lin_0.2).",
    )
    clip_range_vf: float | None = Field(
        None,
        gt=0,
        description="ppo: clip the new value estimates to this distance from the old ones in "
        "the value loss (SB3's clip_range_vf); null: no value clipping.",
    )
    normalize_advantage: bool = Field(
        True, description="ppo: normalise the advantages of each minibatch."
    )
    vtrace_rho_bar: float = Field(
        1.0, gt=0, description="impala: V-trace's truncation of the importance weights (rho bar)."
    )
    vtrace_c_bar: float = Field(
        1.0, gt=0, description="impala: V-trace's truncation of the traces (c bar)."
    )
    vtrace_lambda: float = Field(
        1.0,
        ge=0,
        le=1,
        description="impala: the traces' decay within V-trace (SEED RL's lambda_: each trace "
        "is lambda x min(c_bar, ratio)); on-policy, the targets are then TD(lambda)'s returns, "
        "as gae_lambda makes A3C's. 1: the paper's n-step targets.",
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$",
        description="ppo and impala: where the learner runs: auto (the master host's first GPU "
        "when torch sees one, else the CPU), cpu, cuda, cuda:N or mps. A device the master host "
        "does not have is refused with 422.",
    )

    @model_validator(mode="after")
    def _learner_runs_push_experience(self) -> LearnerFields:
        if self.algo != "a3c" and self.sync_mode != "gradients":
            raise ValueError(
                f"sync_mode {self.sync_mode!r} is A3C's: algo {self.algo!r} has a data flow of "
                "its own; leave sync_mode out"
            )
        return self

    @model_validator(mode="after")
    def _minibatches_fit(self) -> LearnerFields:
        environments = self.num_envs * self.queue_size
        if self.algo == "impala" and self.minibatches > environments:
            raise ValueError(
                f"minibatches {self.minibatches} is more than the {environments} environments "
                "of a batch (num_envs x queue_size): each minibatch takes whole environments"
            )
        return self

