"""Asynchronous DQN and Gorila (`algo: "dqn"`): every worker is an actor, a replay memory and a
learner of its own, and the master is the parameter server (seeds 000 and 001).

A worker acts epsilon-greedily with the global weights it last received, its epsilon falling
linearly over its own env steps (`exploration_steps`, as asynchronous DQN anneals each actor's).
Each rollout's n-step transitions (a3c_http/algos/dqn/loss.py) go into its bounded replay; once
that holds `learning_starts`, it samples `gradient_steps` minibatches after each rollout and
pushes the DQN loss's gradients through the cluster's gradient path, where the master refuses
those too stale (`max_staleness`) or outliers (`outlier_sigma`), as Gorila's parameter server
does, and applies the rest with its optimizer. The target network is the master's
(master/learning/target.py): the worker fetches it by version whenever its weights are
`target_update` versions past the target it holds, so every worker bootstraps from the same
weights.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from a3c_http.algos.base import Algorithm, GradientUpdate, Sends, WorkerPort, gradients
from a3c_http.algos.dqn.loss import Transitions, dqn_loss, nstep_transitions
from a3c_http.algos.learner import rollout_tensors
from a3c_http.algos.replay import Replay
from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import make_env
from a3c_http.envs.rollout import Rollout
from a3c_http.models.q_network import EpsilonGreedy, QNetwork
from a3c_http.optim.flatnet import bind
from a3c_http.wire import tensors as wire


def q_network(config: TrainConfig) -> QNetwork:
    """The Q-network the value-based algorithms (dqn, apex) train, for the run's spaces."""
    env = make_env(config.env_id, config.env_kwargs, config.preprocess, config.frame_stack)
    try:
        return QNetwork.for_spaces(
            env.observation_space,
            env.action_space,
            hidden_sizes=config.hidden_sizes,
            encoder=config.encoder,
            dueling=config.dueling,
        )
    finally:
        env.close()


def epsilon_at(config: TrainConfig, env_steps: int) -> float:
    """A worker's epsilon after `env_steps` of its own: linear from exploration_initial_eps to
    exploration_final_eps over exploration_steps, then constant."""
    start, end = config.exploration_initial_eps, config.exploration_final_eps
    if env_steps >= config.exploration_steps:
        return end
    return start + (end - start) * env_steps / config.exploration_steps


def rollout_transitions(r: Mapping[str, torch.Tensor], config: TrainConfig) -> Transitions:
    """The n-step transitions (one per valid step) of a rollout's tensors (`rollout_tensors`,
    as a worker has them and the learner receives them)."""
    return nstep_transitions(
        r["obs"], r["actions"], r["rewards"], r["terminated"], r["truncated"], r["valid"],
        r["last_obs"], config.n_step, config.gamma,
    )  # fmt: skip


class AnnealedEpsilon(EpsilonGreedy):
    """A worker's epsilon-greedy policy whose epsilon follows `epsilon_at` over the env steps
    of its rollouts (`observe`)."""

    def __init__(self, model: nn.Module, config: TrainConfig) -> None:
        super().__init__(model, epsilon_at(config, 0))
        self.config = config
        self.env_steps = 0

    def observe(self, rollout: Rollout) -> None:
        self.env_steps += rollout.num_steps
        self.epsilon = epsilon_at(self.config, self.env_steps)


class AsyncDQN(Algorithm):
    """The worker's side of asynchronous DQN (the module's docstring)."""

    name = "dqn"
    sends = Sends.GRADIENTS
    target_network = True
    plays = "greedy"

    @classmethod
    def model(cls, config: TrainConfig) -> nn.Module:
        return q_network(config)

    @classmethod
    def target_refresh_every(cls, config: TrainConfig) -> int | None:
        return config.target_update  # the master's target network, which the workers fetch

    def __init__(self, config: TrainConfig, model: nn.Module, policy: object) -> None:
        super().__init__(config, model, AnnealedEpsilon(model, config))
        self.replay = Replay(config.buffer_size)
        self.target = copy.deepcopy(model).requires_grad_(False)
        self._target_flat = bind(self.target, wire.Layout.of(self.target, config.wire_dtype))
        self.target_version: int | None = None
        self.rng = np.random.default_rng(torch.initial_seed())  # the worker's seed

    def pushes_in_flight(self) -> int:
        return self.config.max_in_flight

    def on_rollout(self, port: WorkerPort, rollout: Rollout) -> None:
        cfg = self.config
        self.policy.observe(rollout)
        with port.learning():
            transitions = rollout_transitions(rollout_tensors(rollout, ()), cfg)
            self.replay.add(dataclasses.asdict(transitions))
        if len(self.replay) < max(cfg.learning_starts, 1):
            port.report_episodes(rollout.episodes)
            return
        self._refresh_target(port)
        for step in range(cfg.gradient_steps):
            with port.learning():
                update = self._update()
            # The rollout's episodes and statistics travel with its first push.
            port.push_gradients(update, rollout if step == 0 else _quiet(rollout), 0.0)

    def _update(self) -> GradientUpdate:
        cfg = self.config
        rows, _, _ = self.replay.sample(cfg.batch_size, generator=self.rng)
        loss, td = dqn_loss(self.model, self.target, Transitions(**rows), cfg.double_q)
        grads, norm = gradients(self.model, loss, cfg.max_grad_norm)
        metrics = {
            "train/loss": float(loss.detach()),
            "train/td_error": float(td.mean()),
            "train/grad_norm": norm,
            "rollout/exploration_rate": self.policy.epsilon,
            "train/target_version": float(self.target_version or 0),
        }
        return GradientUpdate(grads, float(loss.detach()), norm, metrics)

    def _refresh_target(self, port: WorkerPort) -> None:
        """Fetch the master's target network when the weights are `target_update` versions past
        the one held (then the master's is newer: it refreshes at that distance)."""
        held = self.target_version
        if held is not None and port.version - held < self.config.target_update:
            return
        weights = port.target_weights(held)
        if weights is not None:
            self._target_flat.copy_(weights.vector)
            self.target_version = weights.version


def _quiet(rollout: Rollout) -> Rollout:
    """The rollout without its finished episodes and statistics (already sent)."""
    return dataclasses.replace(rollout, episodes=[], statistics={})
