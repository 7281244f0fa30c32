"""Which algorithm a run's config selects: its `algo`, and for A3C its `sync_mode`."""

from __future__ import annotations

from typing import Any

from torch import nn

from a3c_http.algos.a2c.algorithm import SyncA2C
from a3c_http.algos.a3c.algorithm import A3C
from a3c_http.algos.apex.algorithm import ApexActor
from a3c_http.algos.base import Algorithm, Sends
from a3c_http.algos.best_weights.algorithm import BestWeights
from a3c_http.algos.dqn.algorithm import AsyncDQN
from a3c_http.algos.impala.algorithm import Impala
from a3c_http.algos.ppo.algorithm import PPO
from a3c_http.config.training import TrainConfig

# By name: A3C's by `sync_mode` value, the others by `algo` value.
ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (A3C, SyncA2C, BestWeights, PPO, Impala, AsyncDQN, ApexActor)
}


def algorithm_class(config: TrainConfig) -> type[Algorithm]:
    """The algorithm of a run's config."""
    return ALGORITHMS[config.sync_mode if config.algo == "a3c" else config.algo]


def learns_from_experience(config: TrainConfig) -> bool:
    """Whether the run's workers push experience to a learner beside the master."""
    return algorithm_class(config).sends is Sends.EXPERIENCE


def algorithm_for(config: TrainConfig, model: nn.Module, policy: Any) -> Algorithm:
    """A worker's algorithm object for its run."""
    return algorithm_class(config)(config, model, policy)
