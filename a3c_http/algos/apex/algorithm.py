"""Ape-X DQN (`algo: "apex"`, Horgan et al. 2018; seed 004): many actors, one prioritized replay and
one learner.

Workers only act, each with its own epsilon (apex_epsilon^(1 + apex_epsilon_alpha * s(k)),
a3c_http/algos/exploration.py), and push their rollouts through the experience path with each
step's n-step transition as they cut it once (a3c_http/algos/dqn/loss.py `nstep_cut`: its return,
discount and bootstrap index) and its initial priority: its absolute TD error under the actor's own
network (`actor_extras`). The learner beside the master (master/learning/learner_process.py) takes
those transitions as they are (`transitions_of`), keeps them in a prioritized replay
(a3c_http/algos/replay.py, `buffer_size`, `prioritized_alpha`) and, once it holds `learning_starts`,
takes `gradient_steps` double-DQN steps on each `queue_size` rollouts, sampling by priority with
importance weights whose exponent rises from `prioritized_beta` to 1 over the run, and setting the
sampled rows' priorities from their new TD errors. Its target network is refreshed every
`target_update` of its steps and sent to the master with the weights, so that it is saved with the
run; the replay is not (a kill loses it, as it loses the learner's queue).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from a3c_http.algos.dqn.algorithm import AnnealedEpsilon, q_network
from a3c_http.algos.dqn.loss import Transitions, dqn_loss, nstep_cut
from a3c_http.algos.learner import ExperienceAlgorithm, Learner, rollout_tensors
from a3c_http.algos.replay_learner import ReplayLearner, transitions_of
from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import Rollout
from a3c_http.models.q_network import QNetwork
from a3c_http.optim.team import SOLO, Team
from a3c_http.wire.tensors import Layout


def actor_extras(model: QNetwork, rollout: Rollout, config: TrainConfig) -> dict[str, torch.Tensor]:
    """What an actor adds to its rollout, `[T, N]` each: the n-step cut of every step
    (`returns`, `discounts`, `stops`: cut here once, the learner takes them as they are) and its
    initial priority (`initial_priorities`)."""
    returns, discounts, stops = nstep_cut(
        rollout.rewards, rollout.terminated, rollout.truncated, config.n_step, config.gamma
    )
    cut = {"returns": returns, "discounts": discounts, "stops": stops}
    return cut | {"priorities": initial_priorities(model, rollout, cut)}


def initial_priorities(
    model: QNetwork, rollout: Rollout, cut: dict[str, torch.Tensor]
) -> torch.Tensor:
    """`[T, N]`: each valid step's absolute n-step TD error under `model` (the online network
    for both the value and the bootstrap, as Ape-X's actors), 0 on the autoreset steps; `cut`:
    the rollout's n-step cut (`actor_extras`)."""
    t = transitions_of({**rollout_tensors(rollout, ()), **cut})
    with torch.no_grad():
        q = model(t.obs).gather(1, t.actions.unsqueeze(1)).squeeze(1)
        y = t.returns + t.discounts * model(t.next_obs).max(dim=1).values
    priorities = torch.zeros(rollout.valid.shape)
    priorities[rollout.valid] = (y - q).abs()
    return priorities


class ApexActor(ExperienceAlgorithm):
    """An actor: its rollouts with their initial priorities go to the learner's replay."""

    name = "apex"
    target_network = True
    plays = "greedy"
    learner: type[Learner]
    # The n-step cut and the replay's initial priorities; no log-probabilities.
    own_tensors = ("returns", "discounts", "stops", "priorities")

    @classmethod
    def model(cls, config: TrainConfig) -> QNetwork:
        return q_network(config)

    @classmethod
    def epsilon_of(cls, config: TrainConfig, share: float) -> float | None:
        """apex_epsilon^(1 + apex_epsilon_alpha * share): the paper's 0.4^(1 + 7 i / (N - 1))."""
        return config.apex_epsilon ** (1.0 + config.apex_epsilon_alpha * share)

    @classmethod
    def own_epsilon(cls, epsilon: float) -> dict[str, Any]:
        """The actor's epsilon as a constant exploration schedule."""
        return {
            "exploration_initial_eps": epsilon,
            "exploration_final_eps": epsilon,
            "exploration_steps": 0,
        }

    def __init__(self, config: TrainConfig, model: Any, policy: Any) -> None:
        # The worker's own config carries its epsilon as a constant schedule (exploration.py
        # `Exploration.config_for`); without one it anneals as a dqn worker's.
        super().__init__(config, model, AnnealedEpsilon(model, config))

    def on_rollout(self, port: Any, rollout: Rollout) -> None:
        self.policy.observe(rollout)
        with port.learning():
            rollout.extras = actor_extras(self.model, rollout, self.config)
        port.push_experience(rollout)


class ApexLearner(ReplayLearner):
    """The learner and its prioritized replay (the module's docstring): double-DQN steps, and
    a target network refreshed every `target_update` of them."""

    def __init__(
        self,
        config: TrainConfig,
        model: QNetwork,
        device: torch.device,
        optimizer_state: dict[str, Any] | None = None,
        *,
        team: Team = SOLO,
    ) -> None:
        super().__init__(config, model, device, optimizer_state, team=team)
        self.target = copy.deepcopy(self.model).requires_grad_(False)
        self.target_step = 0  # the step the target was taken at
        self.target_changed = False  # since the last `take_target`

    def restore_target(self, vector: torch.Tensor) -> None:
        """Start from a saved target network (its weights as one vector in the global layout);
        the next is taken `target_update` steps on."""
        layout = Layout.of(self.target)
        self.target.load_state_dict({k: v.to(self.device) for k, v in layout.views(vector).items()})

    def take_target(self) -> torch.Tensor | None:
        """The target network as a CPU vector (the global layout) when it changed since the
        last call, else None."""
        if not self.target_changed:
            return None
        self.target_changed = False
        layout = Layout.of(self.target)
        return layout.flatten({k: v.cpu() for k, v in self.target.state_dict().items()})

    def train_step(
        self, batch: Transitions, weights: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        loss, td = dqn_loss(self.model, self.target, batch, cfg.double_q, weights)
        norm = self.step(loss)
        if self.steps + 1 - self.target_step >= cfg.target_update:
            self.target.load_state_dict(self.model.state_dict())
            self.target_step, self.target_changed = self.steps + 1, True
        metrics = {"train/loss": float(loss.detach()), "train/td_error": float(td.mean())}
        return td, metrics | {"train/grad_norm": norm}


ApexActor.learner = ApexLearner
