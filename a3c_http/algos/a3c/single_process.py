"""The learner in one process, without HTTP: A2C, the cluster's algorithm with one worker and no
staleness. The benchmarks measure it beside the cluster, and the learning tests use it.

Every step is the one the cluster takes: the worker's rollout, loss and clipped gradients
(a3c_http.envs.rollout, a3c_http.algos.a3c.algorithm), then the master's optimizer step and
statistics merge (a3c_http/optim/flatnet.py, which master/learning/parameter_server.py uses too).

It can also play several workers in turn, to show what the cluster's staleness does to learning
without the cores to run the workers at once (`scripts/bench.py staleness`). W workers each have
their own environments and their own copy of the weights, and take turns: each computes a rollout on
its copy, the master's step applies it, and the worker then loads the weights that the step after
its own push `lag` turns ago made. Lag 1 is a worker that waits for each reply (`max_in_flight: 0`):
every update is W - 1 versions old. Lag 2 is one that keeps a push in flight while it computes the
next, as on loopback: 2W - 1 (docs/performance.md, "Staleness"). In a cluster the workers' timing
varies the staleness around these; here it is exact, and the runs are repeatable. Nothing is
refused: with lag x W - 1 under `max_staleness` none is too stale, and the outlier check
(`outlier_sigma`), which refuses under 1 % of pushes, is the master's alone.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from a3c_http.algos.a3c.algorithm import rollout_loss
from a3c_http.algos.base import gradients
from a3c_http.algos.registry import model_for
from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import RolloutCollector
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.optim.flatnet import FlatNetwork, bind
from a3c_http.optim.optimizers import learning_rate, lr_scale, set_learning_rate


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
    staleness_total: int = 0  # over the updates: versions between an update's weights and its step

    @property
    def staleness_mean(self) -> float | None:
        return self.staleness_total / self.updates if self.updates else None


def train(
    config: TrainConfig,
    max_steps: int,
    window: int = 100,
    *,
    progress: Callable[[int], None] | None = None,
    workers: int = 1,
    lag: int = 1,
) -> Result:
    """Train until the mean return of the last `window` episodes reaches config.target_return
    (resolved from the environment when unset), or for `max_steps` env steps. `progress`, when
    given, is called with the env steps so far after every update (the benchmarks time the
    steady state with it). `workers` and `lag`: the workers played in turn (the module's
    docstring); one with lag 1 is A2C, which steps the global network's own weights."""
    if workers < 1 or lag < 1:
        raise ValueError(f"workers and lag must be at least 1, not {workers} and {lag}")
    config = config.resolved()
    torch.manual_seed(config.seed)
    model = model_for(config)
    net = FlatNetwork(model, config)
    if workers == 1 and lag == 1:
        actors = [_Actor(model, config, config.seed)]
    else:  # copies: no random number drawn, so that the first worker's actions are A2C's draws
        actors = [
            _Actor(copy.deepcopy(model), config, config.seed + 1_000_003 * i, net, lag)
            for i in range(workers)
        ]
    recent: deque[float] = deque(maxlen=window)
    returns: list[float] = []
    steps = updates = staleness_total = 0  # updates: the global weights' version too
    started = time.monotonic()
    solved = False
    try:
        while steps < max_steps and not solved:
            actor = actors[updates % len(actors)]
            rollout = actor.collector.collect(actor.model, config.t_max)
            steps += rollout.num_steps
            grads, _ = gradients(
                actor.model, rollout_loss(actor.model, rollout, config).total, config.max_grad_norm
            )
            set_learning_rate(net.optimizer, learning_rate(config, steps))
            staleness = updates - actor.version
            net.step(
                [net.layout.flatten(grads | rollout.statistics)],
                lr_scale(staleness, config.staleness_scaling),
            )
            updates += 1
            staleness_total += staleness
            actor.replied(updates)
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
        for actor in actors:
            actor.collector.close()
    return Result(
        solved=solved,
        env_steps=steps,
        episodes=len(returns),
        updates=updates,
        seconds=time.monotonic() - started,
        mean_return_100=sum(recent) / len(recent) if recent else None,
        returns=returns,
        model=model,
        staleness_total=staleness_total,
    )


class _Actor:
    """One worker played in turn: its environments, its model, the version of the weights in it
    and the weights of the steps after its pushes, until it loads them `lag` pushes later.
    `global_net`: the network whose weights it copies; None when its model is the global one
    (A2C)."""

    def __init__(
        self,
        model: ActorCritic,
        config: TrainConfig,
        seed: int,
        global_net: FlatNetwork | None = None,
        lag: int = 1,
    ) -> None:
        self.model = model
        self.collector = RolloutCollector.for_config(config, seed)
        self.version = 0
        self._global = global_net
        self._flat = None if global_net is None else bind(model, global_net.layout)
        self._lag = lag
        self._replies: deque[tuple[int, torch.Tensor]] = deque()

    def replied(self, version: int) -> None:
        """The master's step after this worker's push made `version`: load the weights of the
        step `lag` pushes ago."""
        if self._global is None:
            self.version = version  # its model is the global network
            return
        self._replies.append((version, self._global.snapshot()))
        if len(self._replies) >= self._lag:
            self.version, weights = self._replies.popleft()
            self._flat.copy_(weights)
