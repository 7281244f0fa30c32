"""The training config (one pydantic model whose field descriptions are the reference) and the
process settings read from the environment.

`TrainConfig` is the body of `POST /train`; the master validates it, resolves what depends on the
environment (`target_return`), saves it with the run and sends it to every worker.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import gymnasium as gym
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class TrainConfig(BaseModel):
    """Everything that shapes one training run. Defaults solve CartPole-v1 in a few minutes on two
    CPU cores with two workers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env_id: str = Field(
        "CartPole-v1",
        description="A gymnasium environment id. Box observations; Discrete or Box actions.",
    )
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for gymnasium.make(env_id, ...)."
    )
    num_envs: int = Field(
        8, ge=1, le=256, description="Environments each worker steps in one batch."
    )
    hidden_sizes: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [64, 64],
        min_length=1,
        max_length=8,
        description="Widths of the shared tanh torso of the actor-critic network.",
    )
    lr: float = Field(
        1e-3,
        gt=0,
        le=1,
        description="Learning rate of the master's Adam optimizer "
        "(and of each worker's own optimizer in best_weights mode).",
    )
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(
        1.0, ge=0, le=1, description="GAE lambda; 1.0 gives plain n-step returns as in A3C."
    )
    t_max: int = Field(8, ge=1, le=10_000, description="Steps per environment in one rollout.")
    entropy_coef: float = Field(0.01, ge=0, description="Weight of the entropy bonus.")
    value_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    max_grad_norm: float = Field(
        0.5, gt=0, description="Gradients are clipped to this global L2 norm before they are sent."
    )
    sync_mode: Literal["gradients", "best_weights"] = Field(
        "gradients",
        description="gradients: A3C, workers push gradients and the master applies them. "
        "best_weights: the original design, a worker whose episode beats the best score pushes "
        "its weights, which become the global weights.",
    )
    max_staleness: int = Field(
        16,
        ge=0,
        description="Gradients computed on weights more than this many versions old are "
        "refused with 409.",
    )
    max_episodes: int | None = Field(None, ge=1, description="Finish after this many episodes.")
    max_steps: int | None = Field(
        2_000_000, ge=1, description="Finish after this many environment steps (all workers)."
    )
    target_return: float | None = Field(
        None,
        description="Finish once the mean return of the last 100 episodes reaches this. "
        "Unset: the environment's reward_threshold (475 for CartPole-v1), if it has one.",
    )
    seed: int | None = Field(
        None, ge=0, description="Seed of the initial weights and the environments; unset draws one."
    )
    heartbeat_interval_s: float = Field(
        2.0, gt=0, le=3600, description="How often a worker reports to the master while it trains."
    )
    heartbeat_timeout_s: float = Field(
        30.0, gt=0, le=86_400, description="A worker silent for longer than this is marked lost."
    )
    start_timeout_s: float | None = Field(
        None,
        gt=0,
        le=86_400,
        description="A worker that accepted POST /start_worker but has not sent its first "
        "message within this is marked lost; unset: heartbeat_timeout_s. Raise it when starting "
        "a worker takes longer than a short heartbeat timeout.",
    )

    @field_validator(
        "lr", "gamma", "gae_lambda", "entropy_coef", "value_coef", "max_grad_norm", "target_return"
    )
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("env_id")
    @classmethod
    def _registered(cls, v: str) -> str:
        env_spec(v)
        return v

    @model_validator(mode="after")
    def _heartbeat_fits(self) -> TrainConfig:
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                "heartbeat_timeout_s must be larger than heartbeat_interval_s, "
                "or every worker would be marked lost between two heartbeats"
            )
        return self

    def resolved(self) -> TrainConfig:
        """The config with `target_return` and `seed` filled in, as saved with a run."""
        updates: dict[str, Any] = {}
        if self.target_return is None:
            threshold = env_spec(self.env_id).reward_threshold
            if threshold is not None:
                updates["target_return"] = float(threshold)
        if self.seed is None:
            updates["seed"] = int.from_bytes(os.urandom(4), "little") >> 1
        return self.model_copy(update=updates) if updates else self


def env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registered spec of `env_id`. An id of the form `module:EnvName-v0` first imports
    `module` (which registers the environment, as `gymnasium.make` does), but only when the module
    is listed in A3C_ENV_MODULES: a training request must not import arbitrary code."""
    module, _, name = env_id.rpartition(":")
    if module:
        allowed = [m.strip() for m in os.environ.get("A3C_ENV_MODULES", "").split(",")]
        if module not in allowed:
            raise ValueError(
                f"module {module!r} is not in A3C_ENV_MODULES, the comma-separated list of modules "
                "allowed to register environments (set it on the master and every worker)"
            )
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"cannot import {module!r}: {exc}") from None
    if name not in gym.registry:
        raise ValueError(f"unknown gymnasium environment {name!r}")
    return gym.spec(name)


def env_float(name: str, default: float) -> float:
    """A positive number from the environment variable `name`; ValueError naming it otherwise."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={raw!r} must be a positive number")
    return value


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={raw!r} must be a whole number >= 1")
    return value


@dataclass(frozen=True)
class Settings:
    """Process settings from environment variables (see the README's configuration reference)."""

    token: str | None = None
    run_dir: Path = Path("runs/latest")
    workers_file: Path = Path("workers.txt")
    master_url: str | None = None
    persist_interval_s: float = 5.0
    queue_max: int = 10_000

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            token=os.environ.get("A3C_TOKEN") or None,
            run_dir=Path(os.environ.get("A3C_RUN_DIR") or "runs/latest"),
            workers_file=Path(os.environ.get("A3C_WORKERS_FILE") or "workers.txt"),
            master_url=os.environ.get("A3C_MASTER_URL") or None,
            persist_interval_s=env_float("A3C_PERSIST_INTERVAL_S", 5.0),
            queue_max=_env_int("A3C_QUEUE_MAX", 10_000),
        )
