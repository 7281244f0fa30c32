"""The actor-critic network: an encoder (config `encoder`), an optional recurrent core (`core`),
a policy head and a value head.

- encoder `mlp`: the flattened observation; `nature_cnn` and `small_cnn`
  (a3c_http/models/encoders.py): a CNN over image observations. Then tanh torsos of `hidden_sizes`,
  shared or one per head (none with `hidden_sizes: []`).
- core `none`: feed-forward; `lstm`: an LSTM cell of `lstm_size` units whose state each
  environment carries (`initial_state`, `act`), zeroed where an episode starts, and which the loss
  runs again over a rollout in time order from the state the rollout began with (`unroll`). The
  torso feeds the LSTM, whose output both heads read; with `lstm_first` the policy and the value
  each have an LSTM of their own over the encoder's features and ReLU layers of `hidden_sizes`
  after it (SB3-contrib's RecurrentPPO's layout, `enable_critic_lstm`, with the RL Zoo's
  settings), and the state is the policy's (h, c) followed by the value's.
- discrete action spaces get a categorical head (logits); Box action spaces a Gaussian head with
  a learned, state-independent log standard deviation.

The same class serves the master (which only holds and updates the weights) and the workers
(which also act with it). The default (`mlp`, `none`) keeps the parameter names of the network
before encoders and cores existed, so runs saved then still open.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from a3c_http.envs.make import make_env
from a3c_http.models.encoders import ImageEncoder, UnsupportedSpace, flat, layer, mlp
from a3c_http.models.normalize import RunningMeanStd

__all__ = ["ActorCritic", "State", "UnsupportedSpace", "build_model"]

# A recurrent state: (h, c) of `[N, lstm_size]` each, or () for a feed-forward network.
State = tuple[torch.Tensor, ...]


class ActorCritic(nn.Module):
    """Policy and value networks over one observation (the module's docstring).

    shared_torso: one tanh MLP feeds both heads (the A3C paper's network); otherwise the policy and
    the value each have their own (SB3's A2C and PPO default), so the value loss does not pull on
    the policy's features. normalize_obs / normalize_reward add running statistics as buffers
    (`obs_rms`, `ret_rms`, see a3c_http.models.normalize): observations are normalised inside
    `forward`, so every holder of the weights (workers, evaluation, a resumed run) sees the same
    inputs.
    """

    def __init__(
        self,
        obs_dim: int | Sequence[int],
        action_dim: int,
        discrete: bool,
        hidden_sizes: Sequence[int] = (64, 64),
        shared_torso: bool = False,
        log_std_init: float = 0.0,
        normalize_obs: bool = False,
        normalize_reward: bool = False,
        encoder: str = "mlp",
        core: str = "none",
        lstm_size: int = 128,
        lstm_first: bool = False,
    ) -> None:
        super().__init__()
        self.obs_shape = (obs_dim,) if isinstance(obs_dim, int) else tuple(obs_dim)
        self.obs_dim = int(np.prod(self.obs_shape))
        self.action_dim = action_dim
        self.discrete = discrete
        self.recurrent = core == "lstm"
        self.lstm_first = self.recurrent and lstm_first
        if normalize_obs:
            self.obs_rms = RunningMeanStd((self.obs_dim,))
        if normalize_reward:
            self.ret_rms = RunningMeanStd(())
        width = self.obs_dim
        if encoder != "mlp":
            self.encoder = ImageEncoder(encoder, self.obs_shape)
            width = self.encoder.width
        if self.lstm_first:
            self.core = self._lstm_cell(width, lstm_size)
            self.value_core = self._lstm_cell(width, lstm_size)
            self.policy_torso, _ = mlp(lstm_size, hidden_sizes, nn.ReLU)
            self.value_torso, width = mlp(lstm_size, hidden_sizes, nn.ReLU)
        elif shared_torso or self.recurrent:
            self.torso, width = mlp(width, hidden_sizes)
        else:
            self.policy_torso, _ = mlp(width, hidden_sizes)
            self.value_torso, width = mlp(width, hidden_sizes)
        if self.recurrent and not self.lstm_first:
            self.core = self._lstm_cell(width, lstm_size)
            width = lstm_size
        self.policy_head = layer(width, action_dim, 0.01)
        self.value_head = layer(width, 1, 1.0)
        if not discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    @staticmethod
    def _lstm_cell(width: int, lstm_size: int) -> nn.LSTMCell:
        cell = nn.LSTMCell(width, lstm_size)
        nn.init.zeros_(cell.bias_ih)
        nn.init.zeros_(cell.bias_hh)
        return cell

    @classmethod
    def for_spaces(
        cls,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: Sequence[int],
        **options: Any,
    ) -> ActorCritic:
        if not isinstance(observation_space, gym.spaces.Box):
            raise UnsupportedSpace(
                f"observation space {observation_space} is not a Box; only Box observations "
                "are supported"
            )
        shape = tuple(int(n) for n in observation_space.shape)
        if isinstance(action_space, gym.spaces.Discrete):
            return cls(shape, int(action_space.n), True, hidden_sizes, **options)
        if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            return cls(shape, int(action_space.shape[0]), False, hidden_sizes, **options)
        raise UnsupportedSpace(
            f"action space {action_space} is neither Discrete nor a one-dimensional Box"
        )

    # The parts, over a batch `[B, *obs_shape]`.
    def _input(self, obs: torch.Tensor) -> torch.Tensor:
        """What the torsos take: the image encoder's features, or the flat observation
        (normalised where the model keeps observation statistics)."""
        if hasattr(self, "encoder"):
            return self.encoder(obs)
        x = flat(obs)
        return self.obs_rms.normalize(x) if hasattr(self, "obs_rms") else x

    def _features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's and the value's features before the core (the same tensor when shared)."""
        x = self._input(obs)
        if self.lstm_first:
            return x, x
        if hasattr(self, "torso"):
            shared = self.torso(x)
            return shared, shared
        return self.policy_torso(x), self.value_torso(x)

    def _distribution(self, pi: torch.Tensor) -> Distribution:
        """The action distribution from policy features of any leading shape."""
        out = self.policy_head(pi)
        # No argument checks: the network's own outputs always fit, and the checks cost a tenth
        # of a rollout's time. A diverged network still shows: its gradients are not finite, and
        # the master refuses them (422).
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        std = self.log_std.clamp(-20.0, 2.0).exp().expand_as(out)
        # Independent sums log-probabilities and entropies over the action dimensions.
        return Independent(Normal(out, std, validate_args=False), 1, validate_args=False)

    def _after_core(
        self, h: torch.Tensor | tuple[torch.Tensor, torch.Tensor], value: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's and the value's features from the core's output: one tensor that both
        heads read, or with `lstm_first` the policy's LSTM's and the value's, each through its
        torso (the value's only where `value`)."""
        if not isinstance(h, tuple):
            return h, h
        h_policy, h_value = h
        return self.policy_torso(h_policy), self.value_torso(h_value) if value else h_value

    def _heads(self, pi: torch.Tensor, v: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        """The action distribution and the value from features of any leading shape."""
        return self._distribution(pi), self.value_head(v).squeeze(-1)

    def _core(
        self, features: torch.Tensor, state: State, starts: torch.Tensor | None
    ) -> tuple[torch.Tensor, State]:
        if starts is not None:  # a new episode begins with a new memory
            keep = (~starts).to(state[0].dtype).unsqueeze(-1)
            state = tuple(part * keep for part in state)
        h, c = self.core(features, state[:2])
        if not self.lstm_first:
            return h, (h, c)
        hv, cv = self.value_core(features, state[2:])
        return (h, hv), (h, c, hv, cv)

    def _unroll_core(
        self,
        features: torch.Tensor,
        state: State,
        starts: torch.Tensor | None,
        cells: tuple[str, ...] = ("core",),
    ) -> list[torch.Tensor]:
        """Each LSTM cell named in `cells` over features `[T, N, width]` in time order from its
        (h, c) in `state` (the first cell's first), its memory zeroed where `starts` `[T, N]`:
        the outputs `[T, N, lstm_size]` of each, the same as `_core` step by step. Each run of an
        environment's steps between episode starts is one sequence, and all of them go through
        each LSTM in one call (padded at their ends, where nothing is read), never a step at a
        time."""
        steps, n = features.shape[:2]
        if starts is None:
            starts = torch.zeros(steps, n, dtype=torch.bool, device=features.device)
        begins = starts.clone()
        begins[0] = True
        flat = begins.t().reshape(-1)  # environment by environment, in time order
        first = torch.nonzero(flat).squeeze(1)  # where each sequence begins
        sequence = torch.cumsum(flat, 0) - 1  # each step's sequence
        place = torch.arange(steps * n, device=flat.device) - first[sequence]
        env, start = first // steps, first % steps
        # A sequence that begins the rollout goes on from its state, unless an episode begins
        # there; one that begins an episode later, from zeros.
        kept = ((start == 0) & ~starts[0][env]).to(features.dtype).unsqueeze(-1)
        inputs = features.transpose(0, 1).reshape(steps * n, -1)
        padded = inputs.new_zeros(int(place.max()) + 1, first.numel(), inputs.shape[-1])
        padded = padded.index_put((place, sequence), inputs)
        outs = []
        for i, cell in enumerate(cells):
            h0, c0 = (part[env] * kept for part in state[2 * i : 2 * i + 2])
            out, _ = self._sequences(cell)(padded, (h0.unsqueeze(0), c0.unsqueeze(0)))
            outs.append(out[place, sequence].reshape(n, steps, -1).transpose(0, 1))
        return outs

    def _sequences(self, cell_name: str) -> nn.LSTM:
        """An nn.LSTM over the parameters of the LSTM cell `cell_name` (the same tensors: its
        steps are the cell's), which runs whole sequences in one call; not a module of the
        network (nothing of it is saved or sent). Made again where the cell's parameters were
        replaced."""
        cell, key = getattr(self, cell_name), f"_sequences_{cell_name}"
        lstm = self.__dict__.get(key)
        if lstm is None or lstm.weight_ih_l0 is not cell.weight_ih:
            lstm = nn.LSTM(cell.input_size, cell.hidden_size)
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                setattr(lstm, f"{name}_l0", getattr(cell, name))
            self.__dict__[key] = lstm
        return lstm

    # The interface of rollouts, the loss and evaluation.
    def initial_state(self, n: int) -> State:
        """The state of `n` environments before their first step: zeros, or () without a core."""
        if not self.recurrent:
            return ()
        zeros = torch.zeros(n, self.core.hidden_size)
        parts = 4 if self.lstm_first else 2  # the policy's (h, c), then the value's
        return zeros, *(zeros.clone() for _ in range(parts - 1))

    def act(
        self,
        obs: torch.Tensor,
        state: State = (),
        starts: torch.Tensor | None = None,
        *,
        value: bool = True,
    ) -> tuple[Distribution, torch.Tensor | None, State]:
        """One step of `[N]` environments: the action distribution, the value and the state
        after it. `starts[i]`: environment i's observation begins an episode (its state is
        zeroed first). `value` False: no value (None) and none of its layers run, for an actor
        whose learner values the rollout itself (every acting policy's `act` takes it); but
        the value's own LSTM (`lstm_first`) still steps, since the state a rollout begins with
        is the one the learner unrolls it from."""
        x = self._input(obs)
        shared = hasattr(self, "torso")
        if self.lstm_first:
            pi = v = x
        else:
            pi = v = self.torso(x) if shared else self.policy_torso(x)
        if self.recurrent:
            h, state = self._core(pi, state or self.initial_state(obs.shape[0]), starts)
            pi, v = self._after_core(h, value)
        elif value and not shared:
            v = self.value_torso(x)
        return self._distribution(pi), self.value_head(v).squeeze(-1) if value else None, state

    def unroll(
        self, obs: torch.Tensor, state: State = (), starts: torch.Tensor | None = None
    ) -> tuple[Distribution, torch.Tensor]:
        """A rollout `[T, N, *obs_shape]` again, in time order from `state` (the one it began
        with), zeroing the state where `starts` `[T, N]` is True: the action distributions and
        values of every step, `[T, N]`. Gradients flow through the whole rollout (truncated
        backpropagation through time)."""
        steps, n = obs.shape[:2]
        pi, v = self._features(obs.reshape(steps * n, *obs.shape[2:]))
        if self.recurrent:
            features, state = pi.reshape(steps, n, -1), state or self.initial_state(n)
            if self.lstm_first:
                h_policy, h_value = self._unroll_core(features, state, starts,
                                                      ("core", "value_core"))  # fmt: skip
                pi, v = self._after_core((h_policy, h_value))
            else:
                pi = v = self._unroll_core(features, state, starts)[0]
        else:
            pi, v = pi.reshape(steps, n, -1), v.reshape(steps, n, -1)
        return self._heads(pi, v)

    def forward(self, obs: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        """The action distribution and the state value for a batch of observations (a recurrent
        network from its initial state)."""
        dist, value, _ = self.act(obs)
        return dist, value

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)[1]

    @staticmethod
    def greedy(dist: Distribution) -> torch.Tensor:
        """The deterministic action: the most likely one, or the Gaussian's mean."""
        return dist.probs.argmax(-1) if isinstance(dist, Categorical) else dist.mean

    @staticmethod
    def drawn(dist: Distribution, noise: torch.Tensor) -> torch.Tensor:
        """An action drawn from `dist` by `noise`, so that the same noise draws the same action
        wherever it is drawn (evaluation, an exported file): for a Categorical, `noise` `[B]`
        uniform in [0, 1) picks the first action whose cumulative probability passes it; for a
        Gaussian, `noise` `[B, action dims]` standard normal is scaled by its std about its mean."""
        if isinstance(dist, Categorical):
            below = (dist.probs.cumsum(-1) <= noise.unsqueeze(-1)).sum(-1)
            return below.clamp(max=dist.probs.shape[-1] - 1)
        return dist.mean + dist.stddev * noise


def build_model(
    env_id: str,
    env_kwargs: dict,
    hidden_sizes: Sequence[int],
    preprocess: str = "none",
    frame_stack: int = 1,
    **options: Any,
) -> ActorCritic:
    """The network for an environment (with the wrappers of `preprocess` and `frame_stack`),
    sized from a throwaway instance of it; `options` go to ActorCritic."""
    env = make_env(env_id, env_kwargs, preprocess, frame_stack)
    try:
        return ActorCritic.for_spaces(
            env.observation_space, env.action_space, hidden_sizes, **options
        )
    finally:
        env.close()
