"""The learner of the algorithms whose actors fill a replay beside the master (Ape-X DQN, Ape-X DPG,
SAC): one loop for all of them, each algorithm's gradient step its own (`train_step`).

Every rollout that arrives is added to the replay (a3c_http/algos/replay.py, `buffer_size`,
uniform or prioritized by `prioritized_alpha`) as the n-step transitions its actor cut once
(a3c_http/algos/dqn/loss.py `nstep_cut`: its `returns`, `discounts` and `stops`), with the initial
priorities its actor computed where it sends them (else the highest so far). Once the replay holds
`learning_starts`, each update takes `gradient_steps` steps, each on `batch_size` transitions
sampled by priority with importance weights whose exponent rises from `prioritized_beta` to 1 over
the run, and sets the sampled rows' priorities from the step's TD errors; each step's batch is
drawn while the step before it runs (from priorities one step older). In a team of learners
(`learners`, a3c_http/optim/team.py) each keeps a shard of the replay: its share of the
rollouts, of `buffer_size`, `learning_starts` and `batch_size`. The rollouts' rate and
the steps' are tied: the master holds an actor's push while the learner's queue is full, so a run
takes `gradient_steps` steps for each `queue_size` rollouts whatever the actors' speed.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from a3c_http.algos.dqn.loss import Transitions, cut_transitions
from a3c_http.algos.learner import Learner
from a3c_http.algos.replay import Replay
from a3c_http.config.training import TrainConfig
from a3c_http.optim.optimizers import learning_rate
from a3c_http.optim.team import SOLO, Team


def transitions_of(r: dict[str, torch.Tensor]) -> Transitions:
    """The transitions of a rollout's tensors as an actor cut them (its `returns`, `discounts`
    and `stops`)."""
    return cut_transitions(
        r["obs"], r["actions"], r["valid"], r["last_obs"], r["returns"], r["discounts"], r["stops"]
    )


class ReplayLearner(Learner):
    """The replay and the loop over it (the module's docstring); subclasses implement
    `train_step`, and `set_learning_rate` where they step optimizers of their own."""

    def __init__(
        self,
        config: TrainConfig,
        model: Any,
        device: torch.device,
        optimizer_state: dict[str, Any] | None = None,
        *,
        team: Team = SOLO,
    ) -> None:
        super().__init__(config, model, device, optimizer_state, team=team)
        # In a team each learner's replay is a shard of the run's: its share of the
        # transitions, prioritized on its own.
        self.replay = Replay(max(1, config.buffer_size // team.size), config.prioritized_alpha)
        seed = config.seed if team.rank == 0 or config.seed is None else [config.seed, team.rank]
        self.rng = np.random.default_rng(seed)
        self.steps = 0  # gradient steps taken (since the learner started)
        # Sampling runs ahead of the steps (Ape-X's learner is handed its minibatches ahead):
        # the next batch is drawn, and moved to the device, while a step runs, from priorities
        # one step old. The lock keeps a draw and a step's priority update apart.
        self._sampler = ThreadPoolExecutor(1, thread_name_prefix="a3c-replay-sampler")
        self._replay_lock = threading.Lock()

    def learn(
        self, rollouts: list[dict[str, torch.Tensor]], env_steps: int
    ) -> dict[str, float] | None:
        """Store the rollouts' transitions (with their priorities, where they carry them); then,
        once the replay holds learning_starts, `gradient_steps` steps: the means of their
        metrics under SB3's names. None: no step yet."""
        cfg, team = self.config, self.team
        for r in self.share(rollouts):
            priorities = r["priorities"][r["valid"]] if "priorities" in r else None
            self.replay.add(dataclasses.asdict(transitions_of(r)), priorities)
        starts = max(-(-cfg.learning_starts // team.size), 1)  # each shard its share of them
        if not team.agree(int(len(self.replay) >= starts), "min"):
            return None
        batch_size = max(1, cfg.batch_size // team.size)
        lr = learning_rate(cfg, env_steps)
        self.set_learning_rate(lr)
        progress = min(1.0, env_steps / cfg.max_steps) if cfg.max_steps else 0.0
        beta = cfg.prioritized_beta + (1.0 - cfg.prioritized_beta) * progress
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}  # a metric of some steps only (a delayed actor's loss)

        def draw() -> tuple[Transitions, np.ndarray, torch.Tensor]:
            with self._replay_lock:
                rows, index, weights = self.replay.sample(batch_size, beta, self.rng)
            moved = {k: v.to(self.device, non_blocking=True) for k, v in rows.items()}
            return Transitions(**moved), index, weights.to(self.device, non_blocking=True)

        ahead = self._sampler.submit(draw)
        for step in range(cfg.gradient_steps):
            batch, index, weights = ahead.result()
            if step + 1 < cfg.gradient_steps:  # the next batch is drawn while this one steps
                ahead = self._sampler.submit(draw)
            errors, metrics = self.train_step(batch, weights)
            with self._replay_lock:
                self.replay.update(index, errors)
            self.steps += 1
            for name, value in metrics.items():
                sums[name] = sums.get(name, 0.0) + value
                counts[name] = counts.get(name, 0) + 1
        self.updates += 1
        return {
            **{name: total / counts[name] for name, total in sums.items()},
            "train/learning_rate": lr,
            "train/n_updates": float(self.steps),
            "train/importance_beta": beta,
            "replay/size": float(len(self.replay)),
            "replay/bytes": float(self.replay.nbytes),
        }

    def set_learning_rate(self, lr: float) -> None:
        """The learning rate of the coming steps (the run's schedule at its env steps)."""
        for group in self.net.optimizer.param_groups:
            group["lr"] = lr

    def train_step(
        self, batch: Transitions, weights: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One gradient step on `batch` (its importance weights `weights`, `[B]`): the sampled
        rows' new priorities (their absolute TD errors, `[B]`) and the step's metrics."""
        raise NotImplementedError
