"""SAC (`algo: "sac"`, Haarnoja et al. 2018, as SB3's): actors sample the current squashed
Gaussian policy and push their rollouts with each step's n-step cut; the learner beside the master
keeps them in its replay (uniform, or prioritized with `prioritized_alpha`) and takes
`gradient_steps` steps on each `queue_size` rollouts. A step, in SB3's order:

1. the entropy coefficient alpha (`auto_entropy`): log alpha descends
   -log alpha (log pi(a|s) + target_entropy), a ~ pi(s);
2. the twin critics descend 1/2 sum_i (Q_i(s, a) - y)^2, y = returns + discounts (min_i
   Q'_i(s', a') - alpha log pi(a'|s')), a' ~ pi(s'), Q' the target critics;
3. the actor descends alpha log pi(a|s) - min_i Q_i(s, a), a ~ pi(s), through the critics as
   they now are (which take no gradient from it);
4. the target critics move `tau` towards the critics every `target_update` steps.

The sampled rows' priorities are their mean absolute TD errors. The network, both optimizers,
alpha's and the target critics are the learner's state, which the master saves; the replay is not
(a kill loses it, as it loses the learner's queue).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from a3c_http.algos.continuous import (
    ActorCriticLearner,
    action_box,
    adam,
    nstep_extras,
    with_bounded_actions,
)
from a3c_http.algos.dqn.loss import Transitions
from a3c_http.algos.learner import ExperienceAlgorithm, Learner
from a3c_http.algos.sac.network import SACNetwork
from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import Rollout
from a3c_http.optim.team import SOLO, Team
from a3c_http.wire.named_tensors import Expected


class SAC(ExperienceAlgorithm):
    """An actor: its rollouts, with their n-step cut, go to the learner's replay."""

    name = "sac"
    plays = "greedy"  # the deterministic policy: the squashed mean
    learner: type[Learner]
    own_tensors = ("returns", "discounts", "stops")

    @classmethod
    def model(cls, config: TrainConfig) -> SACNetwork:
        obs_dim, box = action_box(config)
        return SACNetwork(obs_dim, box, config.hidden_sizes)

    @classmethod
    def expected(cls, config: TrainConfig, model: Any) -> dict[str, Expected]:
        return with_bounded_actions(super().expected(config, model), model.box)

    def on_rollout(self, port: Any, rollout: Rollout) -> None:
        rollout.extras = nstep_extras(rollout, self.config)
        port.push_experience(rollout)


class SACLearner(ActorCriticLearner):
    """The learner (the module's docstring)."""

    def __init__(
        self,
        config: TrainConfig,
        model: SACNetwork,
        device: torch.device,
        optimizer_state: dict[str, Any] | None = None,
        *,
        team: Team = SOLO,
    ) -> None:
        self.log_alpha = torch.tensor(
            math.log(config.entropy_coef_init if config.auto_entropy else config.entropy_coef),
            device=device,
            requires_grad=config.auto_entropy,
        )
        dims = model.box.dims
        self.target_entropy = (
            -float(dims) if config.target_entropy is None else config.target_entropy
        )
        super().__init__(config, model, device, optimizer_state, team=team)

    def own_state(self) -> dict[str, torch.Tensor]:
        return {"log_alpha": self.log_alpha.data}

    def own_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        if not self.config.auto_entropy:
            return {}
        return {"alpha": adam([self.log_alpha], self.config.lr)}

    def train_step(
        self, batch: Transitions, weights: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        model, box, metrics = self.model, self.model.box, {}
        actions, log_pi = model.policy(batch.obs).rsample()
        alpha = self.log_alpha.detach().exp()  # this step's, before its own update (as SB3)
        if self.config.auto_entropy:
            alpha_loss = -(self.log_alpha * (log_pi.detach() + self.target_entropy)).mean()
            self.optimizers["alpha"].zero_grad()
            alpha_loss.backward()
            if math.isfinite(float(alpha_loss.detach())):
                self.optimizers["alpha"].step()
            metrics["train/ent_coef_loss"] = float(alpha_loss.detach())
        with torch.no_grad():
            next_actions, next_log_pi = model.policy(batch.next_obs).rsample()
            next_q = self.target.critic(batch.next_obs, next_actions).min(dim=0).values
            y = batch.returns + batch.discounts * (next_q - alpha * next_log_pi)
        q = model.critic(batch.obs, box.to_unit(batch.actions))  # [2, B]
        td = q - y
        critic_loss = 0.5 * (td.pow(2) * weights).mean(dim=1).sum()
        self.step_part("critic", critic_loss)
        with self.frozen_critics():
            q_pi = model.critic(batch.obs, actions).min(dim=0).values
            actor_loss = (alpha * log_pi - q_pi).mean()
            self.step_part("actor", actor_loss)
        self.update_target(["critic"])
        return td.detach().abs().mean(dim=0), metrics | {
            "train/critic_loss": float(critic_loss.detach()),
            "train/actor_loss": float(actor_loss.detach()),
            "train/ent_coef": float(alpha),
        }


SAC.learner = SACLearner
