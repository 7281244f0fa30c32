"""Ape-X DPG (`algo: "apex_dpg"`, Horgan et al. 2018; seed 004): many actors, one prioritized
replay, one learner, for continuous actions.

Workers act with the deterministic actor plus Gaussian noise of their own scale
(dpg_noise^(1 + dpg_noise_alpha * s(k)), clipped to the action Box: `NoisyPolicy`), and push their
rollouts with each step's n-step cut and its initial priority, the absolute n-step TD error under
their own actor and critic (`initial_priorities`). The learner beside the master keeps them in its
prioritized replay (a3c_http/algos/replay_learner.py) and takes `gradient_steps` steps on each
`queue_size` rollouts:

1. the critic (each of TD3's twins) descends (Q(s, a) - y)^2, y = returns + discounts
   min_i Q'_i(s', mu'(s') + clip(noise)), mu' and Q' the target networks (`target_noise`: TD3's
   smoothing), each sample weighted by its importance weight;
2. every `policy_delay` steps the actor ascends Q_1(s, mu(s)), through the critic as it now is
   (which takes no gradient from it), and the target networks move `tau` towards the online ones
   (every `target_update` steps: 1 and tau 1 copy them, a hard update).

The sampled rows' priorities are their absolute TD errors (the mean of the twins'). The network,
both optimizers and the target networks are the learner's state, which the master saves; the
replay is not.
"""

from __future__ import annotations

from typing import Any

import torch

from a3c_http.algos.apex_dpg.network import DPGNetwork, NoisyPolicy
from a3c_http.algos.continuous import (
    ActorCriticLearner,
    action_box,
    nstep_extras,
    with_bounded_actions,
)
from a3c_http.algos.dqn.loss import Transitions
from a3c_http.algos.learner import ExperienceAlgorithm, Learner, rollout_tensors
from a3c_http.algos.replay_learner import transitions_of
from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import Rollout
from a3c_http.wire.named_tensors import Expected


def initial_priorities(
    model: DPGNetwork, rollout: Rollout, cut: dict[str, torch.Tensor]
) -> torch.Tensor:
    """`[T, N]`: each valid step's absolute n-step TD error under the actor's own network (its
    actor for the bootstrap action, its critic for both values, as Ape-X's actors), 0 on the
    autoreset steps; `cut`: the rollout's n-step cut."""
    t = transitions_of({**rollout_tensors(rollout, ()), **cut})
    with torch.no_grad():
        q = model.critic(t.obs, model.box.to_unit(t.actions)).mean(dim=0)
        y = t.returns + t.discounts * model.critic(t.next_obs, model.action(t.next_obs)).mean(0)
    priorities = torch.zeros(rollout.valid.shape)
    priorities[rollout.valid] = (y - q).abs()
    return priorities


class ApexDPG(ExperienceAlgorithm):
    """An actor: its rollouts, with their n-step cut and initial priorities, go to the learner's
    replay."""

    name = "apex_dpg"
    plays = "greedy"  # the deterministic actor, without noise
    learner: type[Learner]
    own_tensors = ("returns", "discounts", "stops", "priorities")

    @classmethod
    def model(cls, config: TrainConfig) -> DPGNetwork:
        obs_dim, box = action_box(config)
        return DPGNetwork(obs_dim, box, config.hidden_sizes, 2 if config.twin_critics else 1)

    @classmethod
    def expected(cls, config: TrainConfig, model: Any) -> dict[str, Expected]:
        return with_bounded_actions(super().expected(config, model), model.box)

    @classmethod
    def epsilon_of(cls, config: TrainConfig, share: float) -> float | None:
        """The actor's noise: dpg_noise^(1 + dpg_noise_alpha * share)."""
        return config.dpg_noise ** (1.0 + config.dpg_noise_alpha * share)

    @classmethod
    def own_epsilon(cls, epsilon: float) -> dict[str, Any]:
        """The actor's noise as its own dpg_noise, with no spread."""
        return {"dpg_noise": epsilon, "dpg_noise_alpha": 0.0}

    def __init__(self, config: TrainConfig, model: Any, policy: Any) -> None:
        # The worker's own config carries its noise (`own_epsilon`); without one (a worker of
        # no place among others: a test's), the first actor's.
        super().__init__(config, model, NoisyPolicy(model, config.dpg_noise))

    def on_rollout(self, port: Any, rollout: Rollout) -> None:
        with port.learning():
            cut = nstep_extras(rollout, self.config)
            rollout.extras = cut | {
                "priorities": initial_priorities(self.model, rollout, cut)
            }
        port.push_experience(rollout)


class ApexDPGLearner(ActorCriticLearner):
    """The learner (the module's docstring)."""

    def train_step(
        self, batch: Transitions, weights: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, model, target = self.config, self.model, self.target
        with torch.no_grad():
            next_actions = target.action(batch.next_obs)
            if cfg.target_noise > 0:
                noise = (torch.randn_like(next_actions) * cfg.target_noise).clamp(
                    -cfg.target_noise_clip, cfg.target_noise_clip
                )
                next_actions = (next_actions + noise).clamp(-1.0, 1.0)
            next_q = target.critic(batch.next_obs, next_actions).min(dim=0).values
            y = batch.returns + batch.discounts * next_q
        q = model.critic(batch.obs, model.box.to_unit(batch.actions))  # [critics, B]
        td = q - y
        critic_loss = (td.pow(2) * weights).mean(dim=1).sum()
        self.step_part("critic", critic_loss)
        metrics = {"train/critic_loss": float(critic_loss.detach())}
        if (self.steps + 1) % cfg.policy_delay == 0:
            with self.frozen_critics():
                actor_loss = -model.critic(batch.obs, model.action(batch.obs))[0].mean()
                self.step_part("actor", actor_loss)
            self.update_target(["actor", "critic"])
            metrics["train/actor_loss"] = float(actor_loss.detach())
        return td.detach().abs().mean(dim=0), metrics


ApexDPG.learner = ApexDPGLearner
