"""PPO (`algo: "ppo"`) as the seed's distributed PPO: workers only act and push their rollouts;
the learner beside the master updates the policy when `queue_size` rollouts have arrived, with
the clipped surrogate of Schulman et al. (2017) as SB3 computes it: GAE advantages from the
learner's own values, `n_epochs` passes of shuffled minibatches of `batch_size` steps, the
advantages normalised per minibatch, an entropy bonus, optional value clipping
(`clip_range_vf`), and the clip range constant or falling linearly with the learning rate.

With `max_in_flight` 0 every worker waits for the update that takes its rollout (synchronous PPO);
with 1, as in the seed, the workers keep acting while the learner updates and their rollouts wait
for the next batch (PPO's trust region bounds how far one update moves the policy, so what they
collected stays usable). The ratio is always taken against the behaviour policy, whose
log-probabilities each rollout carries (SB3's PPO exactly for a rollout of the current weights),
and rollouts more than `max_policy_lag` versions old are dropped before they reach here
(master/learning/learner_process.py). Clipping around the policy at the update's start instead, each
step weighted by its importance to the behaviour policy (decoupled PPO, Hilton, Cobbe and
Schulman 2021), solved CartPole in more env steps here (docs/performance.md).

A recurrent policy's minibatches are whole environments' sequences, unrolled from the state their
rollout began with.
"""

from __future__ import annotations

import torch

from a3c_http.algos.a3c.algorithm import compute_advantages
from a3c_http.algos.learner import Batch, ExperienceAlgorithm, Learner, explained_variance
from a3c_http.config.training import TrainConfig


def clip_range(config: TrainConfig, env_steps: int) -> float:
    """The clip range after `env_steps` steps: constant, or falling linearly to 0 at max_steps."""
    if config.clip_range_schedule == "constant" or not config.max_steps:
        return config.clip_range
    return config.clip_range * max(0.0, 1.0 - env_steps / config.max_steps)


def ppo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    config: TrainConfig,
    clip: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate, value and entropy terms of one minibatch (flat tensors of its valid
    steps), and their metrics under SB3's names. `old_log_prob`: the behaviour policy's, which
    the ratio is clipped around."""
    if config.normalize_advantage and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = torch.exp(log_prob - old_log_prob)
    surrogate = torch.min(advantages * ratio, advantages * ratio.clamp(1 - clip, 1 + clip))
    policy_loss = -surrogate.mean()
    if config.clip_range_vf is not None:
        bound = config.clip_range_vf
        values = old_values + (values - old_values).clamp(-bound, bound)
    value_loss = (returns - values).pow(2).mean()
    entropy_loss = -entropy.mean()
    loss = policy_loss + config.entropy_coef * entropy_loss + config.value_coef * value_loss
    with torch.no_grad():
        log_ratio = log_prob - old_log_prob
        metrics = {
            "train/policy_gradient_loss": float(policy_loss),
            "train/value_loss": float(value_loss),
            "train/entropy_loss": float(entropy_loss),
            "train/loss": float(loss),
            "train/clip_fraction": float(((ratio - 1).abs() > clip).float().mean()),
            "train/approx_kl": float(((ratio - 1) - log_ratio).mean()),
        }
    return loss, metrics


class PPOLearner(Learner):
    waits_for_update = True
    adam_eps = 1e-5  # SB3's PPO

    def update(self, batch: Batch, env_steps: int) -> dict[str, float]:
        cfg = self.config
        with torch.no_grad():
            dist, values = batch.unroll(self.model)
            steps = batch.actions.shape[0]
            actions = torch.cat([batch.actions, batch.actions[-1:]])
            # How the policy the update starts from differs from the one that acted (1 for a
            # rollout of the same weights): a figure, not a term of the loss.
            behaviour_ratio = torch.exp(dist.log_prob(actions)[:steps] - batch.log_probs)
            advantages, returns = compute_advantages(
                batch.rewards, values[:-1], values[-1], batch.terminated, batch.truncated,
                batch.valid, cfg.gamma, cfg.gae_lambda,
            )  # fmt: skip
        old_values = values[:-1]
        clip = clip_range(cfg, env_steps)
        sums: dict[str, float] = {}
        count = 0
        for _ in range(cfg.n_epochs):
            for index in self._minibatches(batch):
                if index.numel() == 0:  # a team's learner whose share has fewer minibatches
                    self.step(None)
                    continue
                loss, metrics = self._minibatch_loss(
                    batch, index, advantages, returns, old_values, clip
                )
                self.step(loss)
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        metrics = {k: v / max(count, 1) for k, v in sums.items()}
        mask = batch.valid
        metrics["train/explained_variance"] = explained_variance(old_values[mask], returns[mask])
        metrics["train/clip_range"] = clip
        metrics["train/behaviour_ratio"] = float(behaviour_ratio[mask].mean())
        return metrics

    def _minibatches(self, batch: Batch) -> list[torch.Tensor]:
        """Shuffled minibatches: indices of valid steps `[T * N]` flat, or of environments
        (whole sequences) for a recurrent policy. In a team each learner's minibatches are its
        share of the team's `batch_size`, and all take as many (the most any needs: a learner
        with fewer steps has smaller ones, or empty ones)."""
        steps, n = batch.valid.shape
        size = self.config.batch_size
        if self.team.size > 1:
            size = max(1, size // self.team.size)
        if self.model.recurrent:
            per = max(1, size // steps)
            order = torch.randperm(n, device=self.device)
        else:
            per = size
            order = torch.nonzero(batch.valid.reshape(-1)).squeeze(1)
            order = order[torch.randperm(order.numel(), device=self.device)]
        parts = list(order.split(per))
        agreed = self.team.agree(len(parts))
        return parts if agreed == len(parts) else list(order.tensor_split(agreed))

    def _minibatch_loss(
        self,
        batch: Batch,
        index: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        old_values: torch.Tensor,
        clip: float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if self.model.recurrent:
            state = tuple(s[index] for s in batch.state)
            dist, values = self.model.unroll(batch.obs[:, index], state, batch.starts[:, index])
            mask = batch.valid[:, index]

            def pick(x: torch.Tensor) -> torch.Tensor:
                return x[:, index][mask]

            log_prob, entropy, values = dist.log_prob(batch.actions[:, index])[mask], \
                dist.entropy()[mask], values[mask]  # fmt: skip
        else:

            def pick(x: torch.Tensor) -> torch.Tensor:
                return x.reshape(-1, *x.shape[2:])[index]

            dist, values = self.model(pick(batch.obs))
            actions = pick(batch.actions)
            log_prob, entropy = dist.log_prob(actions), dist.entropy()
        return ppo_loss(
            log_prob, pick(batch.log_probs), pick(advantages), values, pick(old_values),
            pick(returns), entropy, self.config, clip,
        )  # fmt: skip


class PPO(ExperienceAlgorithm):
    name = "ppo"
    learner = PPOLearner
