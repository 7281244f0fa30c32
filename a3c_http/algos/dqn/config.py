"""DQN's config section, and the fields and checks it shares with Ape-X's (`ValueBasedConfig`).
The names are SB3's DQN's where it has one (buffer_size, learning_starts, gradient_steps,
exploration_*)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from a3c_http.algos.dqn.presets import DEFAULTS, DQN_PRESETS
from a3c_http.algos.learner_config import replay_never_fills
from a3c_http.algos.sharded import ShardedConfig
from a3c_http.config.training import TrainConfig


class ValueBasedConfig(TrainConfig):
    """What the algorithms that learn Q-values share: a Q-network (a3c_http/models/q_network.py),
    n-step transitions in a replay, a target network."""

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
    batch_size: int = Field(
        64, ge=1, le=1_000_000, description="Transitions in one minibatch from the replay."
    )

    @model_validator(mode="after")
    def _value_based_fits(self) -> ValueBasedConfig:
        problems = {
            "core": ("lstm", "a recurrent Q-network is not offered; leave core 'none'"),
            "normalize_obs": (True, "the Q-networks take observations as they are"),
            "normalize_reward": (True, "the replay keeps the rewards as they are"),
        }
        for field, (bad, why) in problems.items():
            if getattr(self, field, None) == bad:
                raise ValueError(f"{field}={bad!r} with algo {self.algo!r}: {why}")
        learners = getattr(self, "learners", 1)  # apex's team shares the replay; dqn's own
        if never := replay_never_fills(self.buffer_size, self.learning_starts, learners):
            raise ValueError(never)
        return self


class DQNConfig(ValueBasedConfig, ShardedConfig):
    """Asynchronous DQN on the parameter server (seed 000) and Gorila (seed 001): each worker with
    its own epsilon and replay pushes double-DQN gradients against the master's target network."""

    defaults: ClassVar[dict[str, Any]] = DEFAULTS
    presets: ClassVar[dict[str, dict[str, Any]]] = DQN_PRESETS

    algo: Literal["dqn"] = Field(
        "dqn",
        description="Asynchronous DQN and Gorila: DQN gradients against the master's target "
        "network.",
    )
    exploration_steps: int = Field(
        10_000,
        ge=0,
        description="Each worker's epsilon falls linearly from exploration_initial_eps to "
        "exploration_final_eps over this many of its own env steps (asynchronous DQN anneals "
        "each actor's own epsilon).",
    )
    exploration_initial_eps: float = Field(1.0, ge=0, le=1, description="Epsilon at first.")
    exploration_final_eps: float = Field(
        0.05, ge=0, le=1, description="Epsilon after exploration_steps."
    )

    @classmethod
    def algorithm(cls) -> type:
        from a3c_http.algos.dqn.algorithm import AsyncDQN

        return AsyncDQN
