"""SAC's network: a squashed Gaussian actor and twin critics, in one module whose parameters are
the actor's then the critics' (a3c_http/algos/continuous.py `ActorCriticLearner`).

It acts as the cluster's other networks do (`act`, `greedy`, `initial_state`): the collector draws
its actions (`SquashedGaussian.sample`, inside the action Box), and evaluation, a3c-evaluate,
a3c-export and load_policy play its deterministic action, the squashed mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from a3c_http.algos.continuous import ActionBox, Critics, relu_mlp
from a3c_http.models.encoders import flat

State = tuple[torch.Tensor, ...]
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SB3's


class SquashedGaussian:
    """tanh(u), u ~ N(mu, std), scaled to the action Box: SAC's policy. `sample` draws an action
    as the environment takes it; `rsample` a reparameterised one in [-1, 1] with its log-density
    (the tanh's change of variables included, in its stable form)."""

    def __init__(self, mu: torch.Tensor, log_std: torch.Tensor, box: ActionBox) -> None:
        self.mu, self.log_std, self.box = mu, log_std, box
        self.std = log_std.exp()

    @property
    def mean(self) -> torch.Tensor:
        """The deterministic action: the squashed mean, in the Box."""
        return self.box.from_unit(torch.tanh(self.mu))

    @property
    def stddev(self) -> torch.Tensor:
        return self.std

    def rsample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """An action in [-1, 1] through which gradients flow, and its log-density `[B]`."""
        u = self.mu + self.std * torch.randn_like(self.mu)
        return torch.tanh(u), self._log_prob_of(u)

    def sample(self) -> torch.Tensor:
        with torch.no_grad():
            return self.box.from_unit(torch.tanh(self.mu + self.std * torch.randn_like(self.mu)))

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """The log-density of an action of the Box (its pre-image under the squash, kept off the
        bounds where tanh saturates)."""
        unit = self.box.to_unit(action).clamp(-1 + 1e-6, 1 - 1e-6)
        return self._log_prob_of(torch.atanh(unit))

    def _log_prob_of(self, u: torch.Tensor) -> torch.Tensor:
        gaussian = -0.5 * ((u - self.mu) / self.std).pow(2) - self.log_std
        gaussian = gaussian - 0.5 * math.log(2 * math.pi)
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))
        squash = 2 * (math.log(2) - u - F.softplus(-2 * u))
        return (gaussian - squash).sum(-1)

    def entropy(self) -> torch.Tensor:
        """An estimate from one draw (the squashed Gaussian has no closed form)."""
        return -self.rsample()[1]


class SACNetwork(nn.Module):
    """The actor (ReLU layers of `hidden_sizes`, then the mean and log-std of u) and twin critics
    Q(s, a) over the flat observation."""

    discrete = False
    recurrent = False

    def __init__(self, obs_dim: int, box: ActionBox, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.box = box
        self.actor, width = relu_mlp(obs_dim, hidden_sizes)
        self.actor_mean = nn.Linear(width, box.dims)
        self.actor_log_std = nn.Linear(width, box.dims)
        self.critic = Critics(2, obs_dim, box.dims, hidden_sizes)

    def policy(self, obs: torch.Tensor) -> SquashedGaussian:
        h = self.actor(flat(obs))
        log_std = self.actor_log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)
        return SquashedGaussian(self.actor_mean(h), log_std, self.box)

    def act(
        self,
        obs: torch.Tensor,
        state: State = (),
        starts: torch.Tensor | None = None,
        *,
        value: bool = True,
    ) -> tuple[SquashedGaussian, torch.Tensor, State]:
        """One step of `[N]` environments: the policy, a value of 0 (the critics value actions,
        not states; a worker bootstraps nothing; `value` changes nothing) and no state."""
        return self.policy(obs), torch.zeros(obs.shape[0]), ()

    def initial_state(self, n: int) -> State:
        return ()

    @staticmethod
    def greedy(dist: SquashedGaussian) -> torch.Tensor:
        return dist.mean
