"""The training config's fields for the value-based algorithms (`algo` dqn and apex): a base of
`TrainConfig` (a3c_http/config/training.py), whose fields and validation they share. The names
are SB3's DQN's where it has one (buffer_size, learning_starts, gradient_steps, exploration_*).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

VALUE_BASED = ("dqn", "apex")


class ValueFields(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    buffer_size: int = Field(
        100_000,
        ge=1,
        le=10_000_000,
        description="dqn: the transitions each worker's own replay memory holds; apex: those the "
        "prioritized replay beside the master holds. The oldest are overwritten; the memory is "
        "set out in full at the first transition (its size in /status).",
    )
    learning_starts: int = Field(
        1000,
        ge=0,
        description="dqn and apex: transitions a replay holds before the first gradient step "
        "(each worker's own for dqn).",
    )
    gradient_steps: int = Field(
        1,
        ge=1,
        le=100_000,
        description="dqn: gradient pushes a worker makes after each of its rollouts (t_max x "
        "num_envs env steps), each on a minibatch of batch_size from its replay; apex: learner "
        "steps on each queue_size rollouts that arrive.",
    )
    target_update: int = Field(
        1000,
        ge=1,
        description="dqn and apex: the target network is the global weights of every "
        "target_update-th version: the master (dqn) or the learner (apex) refreshes it when the "
        "weights are that many versions past it.",
    )
    n_step: int = Field(
        1, ge=1, le=1000, description="dqn and apex: the steps of each transition's return."
    )
    dueling: bool = Field(
        False, description="dqn and apex: a dueling Q head (value and advantage streams)."
    )
    double_q: bool = Field(
        True,
        description="dqn and apex: double DQN (the online network picks the bootstrap action, "
        "the target network values it); false: the target network's own maximum.",
    )
    exploration_steps: int = Field(
        10_000,
        ge=0,
        description="dqn: each worker's epsilon falls linearly from exploration_initial_eps to "
        "exploration_final_eps over this many of its own env steps (asynchronous DQN anneals "
        "each actor's own epsilon).",
    )
    exploration_initial_eps: float = Field(1.0, ge=0, le=1, description="dqn: epsilon at first.")
    exploration_final_eps: float = Field(
        0.05, ge=0, le=1, description="dqn: epsilon after exploration_steps."
    )
    apex_epsilon: float = Field(
        0.4,
        gt=0,
        lt=1,
        description="apex: worker k acts with epsilon apex_epsilon^(1 + apex_epsilon_alpha * "
        "s(k)), s(k) = 0, 1, 1/2, 1/4, 3/4, ... its place among the workers (as "
        "entropy_coef_max spreads): Ape-X's 0.4^(1 + 7 i / (N - 1)) for any number of workers.",
    )
    apex_epsilon_alpha: float = Field(
        7.0, ge=0, le=100, description="apex: the exponent's spread (see apex_epsilon)."
    )
    prioritized_alpha: float = Field(
        0.6,
        ge=0,
        le=1,
        description="apex: how much the priorities shape sampling (0: uniform).",
    )
    prioritized_beta: float = Field(
        0.4,
        ge=0,
        le=1,
        description="apex: the importance weights' exponent at the start, annealed linearly "
        "to 1 as env steps approach max_steps.",
    )

    @model_validator(mode="after")
    def _value_based_fits(self) -> ValueFields:
        algo = getattr(self, "algo", "a3c")
        if algo not in VALUE_BASED:
            return self
        problems = {
            "core": ("lstm", "a recurrent Q-network is not offered; leave core 'none'"),
            "normalize_obs": (True, "the Q-networks take observations as they are"),
            "normalize_reward": (True, "the replay keeps the rewards as they are"),
        }
        for field, (bad, why) in problems.items():
            if getattr(self, field, None) == bad:
                raise ValueError(f"{field}={bad!r} with algo {algo!r}: {why}")
        return self

    @property
    def value_based(self) -> bool:
        """Whether the run learns Q-values (dqn, apex)."""
        return getattr(self, "algo", "a3c") in VALUE_BASED
