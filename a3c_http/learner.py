"""The learner in one process, without HTTP: A2C, the cluster's algorithm with one worker and no
staleness. The benchmarks measure it beside the cluster, and the learning tests use it.

Every step is the one the cluster takes: the worker's rollout, loss and clipped gradients
(a3c_http.rollout, a3c_http.a3c), then the master's optimizer step and statistics merge
(a3c_http/flatnet.py, which master/params.py uses too).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from a3c_http.a3c import gradients, learning_rate, rollout_loss, set_learning_rate
from a3c_http.config import TrainConfig
from a3c_http.flatnet import FlatNetwork
from a3c_http.model import ActorCritic, model_for
from a3c_http.rollout import RolloutCollector


@dataclass
class Result:
    solved: bool
    env_steps: int
    episodes: int
    updates: int
    seconds: float
    mean_return_100: float | None
    returns: list[float] = field(default_factory=list)
    model: ActorCritic | None = None  # the trained network


def train(
    config: TrainConfig,
    max_steps: int,
    window: int = 100,
    *,
    progress: Callable[[int], None] | None = None,
) -> Result:
    """Train until the mean return of the last `window` episodes reaches config.target_return
    (resolved from the environment when unset), or for `max_steps` env steps. `progress`, when
    given, is called with the env steps so far after every update (the benchmarks time the
    steady state with it)."""
    config = config.resolved()
    torch.manual_seed(config.seed)
    model = model_for(config)
    net = FlatNetwork(model, config)
    collector = RolloutCollector.for_config(config, config.seed)
    recent: deque[float] = deque(maxlen=window)
    returns: list[float] = []
    steps = updates = 0
    started = time.monotonic()
    solved = False
    try:
        while steps < max_steps and not solved:
            rollout = collector.collect(model, config.t_max)
            steps += rollout.num_steps
            grads, _ = gradients(
                model, rollout_loss(model, rollout, config).total, config.max_grad_norm
            )
            set_learning_rate(net.optimizer, learning_rate(config, steps))
            net.step([net.layout.flatten(grads | rollout.statistics)])
            updates += 1
            for episode in rollout.episodes:
                recent.append(episode.reward)
                returns.append(episode.reward)
            solved = (
                config.target_return is not None
                and len(recent) == window
                and sum(recent) / window >= config.target_return
            )
            if progress is not None:
                progress(steps)
    finally:
        collector.close()
    return Result(
        solved=solved,
        env_steps=steps,
        episodes=len(returns),
        updates=updates,
        seconds=time.monotonic() - started,
        mean_return_100=sum(recent) / len(recent) if recent else None,
        returns=returns,
        model=model,
    )
