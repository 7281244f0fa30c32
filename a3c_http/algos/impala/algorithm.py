"""IMPALA (`algo: "impala"`, Espeholt et al. 2018): workers only act and push their rollouts; the
learner beside the master takes `n_epochs` optimizer steps (the paper's one by default) on each
`queue_size` rollouts, with V-trace targets that correct for the lag between the policy that acted
(the behaviour policy, whose log-probabilities each rollout carries) and the learner's: rollouts
several versions old still count, weighted by their truncated importance ratios.

Episode ends are encoded as in a3c_http/algos/a3c/algorithm.py (gymnasium's NEXT_STEP autoreset):
the step after an episode end is not a transition (`valid` False) and the chain of corrections
stops at every end; a truncated episode bootstraps from the value of its last observation.
"""

from __future__ import annotations

import torch

from a3c_http.algos.learner import Batch, ExperienceAlgorithm, Learner, explained_variance


def vtrace(
    log_rhos: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    last_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    valid: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets `vs` and the policy gradient's advantages, `[T, N]` each (zero where
    `valid` is False), from the log importance ratios log(pi/mu) of the actions taken, the
    learner's values `[T, N]` and the value after the last step `[N]` (Espeholt et al. 2018,
    section 4.1), each trace decayed by `lam` (SEED RL's `lambda_`). With ratios of 1
    (on-policy) and c_bar >= 1, `vs` are the lambda-returns (GAE's returns at `lam`; the
    n-step returns at 1)."""
    valid_f = valid.float()
    rhos = torch.exp(log_rhos) * valid_f
    clipped_rhos = rhos.clamp(max=rho_bar)
    cs = rhos.clamp(max=c_bar) * lam
    term = terminated.float()
    done = torch.maximum(term, truncated.float())
    next_values = torch.cat([values[1:], last_value.unsqueeze(0)])
    deltas = clipped_rhos * (rewards + gamma * next_values * (1 - term) - values)
    corrections = torch.zeros_like(values)
    running = torch.zeros_like(last_value)
    for t in reversed(range(values.shape[0])):
        running = (deltas[t] + gamma * cs[t] * (1 - done[t]) * running) * valid_f[t]
        corrections[t] = running
    vs = values + corrections
    # The target of the next state: vs where the episode goes on; where it was truncated, the
    # autoreset step's vs is the value of its last observation (its correction is 0).
    next_vs = torch.cat([vs[1:], last_value.unsqueeze(0)])
    advantages = clipped_rhos * (rewards + gamma * next_vs * (1 - term) - values) * valid_f
    return vs * valid_f, advantages


class ImpalaLearner(Learner):
    def update(self, batch: Batch, env_steps: int) -> dict[str, float]:
        """`n_epochs` passes over the batch (RLlib's IMPALA `num_epochs`), each an optimizer
        step on every one of its `minibatches` (groups of its environments), with V-trace
        targets from the network as it is then; the metrics of the last."""
        for _ in range(self.config.n_epochs):
            for part in batch.split(self.config.minibatches):
                metrics = self._step_on(part)
        return metrics

    def _step_on(self, batch: Batch) -> dict[str, float]:
        cfg = self.config
        dist, values_all = batch.unroll(self.model)
        values, last_value = values_all[:-1], values_all[-1]
        steps = values.shape[0]
        log_prob = dist.log_prob(torch.cat([batch.actions, batch.actions[-1:]]))[:steps]
        entropy = dist.entropy()[:steps]
        with torch.no_grad():
            log_rhos = log_prob - batch.log_probs
            vs, advantages = vtrace(
                log_rhos, batch.rewards, values, last_value, batch.terminated, batch.truncated,
                batch.valid, cfg.gamma, cfg.vtrace_rho_bar, cfg.vtrace_c_bar, cfg.vtrace_lambda,
            )  # fmt: skip
        mask = batch.valid.float()
        count = mask.sum().clamp(min=1)
        policy_loss = -(log_prob * advantages * mask).sum() / count
        value_loss = ((vs - values).pow(2) * mask).sum() / count
        entropy_mean = (entropy * mask).sum() / count
        loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy_mean
        norm = self.step(loss)
        valid = batch.valid
        with torch.no_grad():
            ratio = torch.exp(log_rhos)[valid]
        return {
            "train/policy_gradient_loss": float(policy_loss.detach()),
            "train/value_loss": float(value_loss.detach()),
            "train/entropy_loss": -float(entropy_mean.detach()),
            "train/loss": float(loss.detach()),
            "train/grad_norm": norm,
            "train/explained_variance": explained_variance(values.detach()[valid], vs[valid]),
            "train/importance_ratio": float(ratio.mean()),
            "train/clip_fraction": float((ratio > cfg.vtrace_rho_bar).float().mean()),
        }


class Impala(ExperienceAlgorithm):
    name = "impala"
    learner = ImpalaLearner
