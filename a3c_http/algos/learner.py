"""The learner's maths, and what else the algorithms that learn from experience (PPO, IMPALA,
Ape-X) share: workers that only act and push their rollouts, what a rollout must hold, and the
learner that updates the network from batches of them (its process beside the master is
master/learning/learner_process.py).

The worker's side (`ExperienceAlgorithm`) runs no backward pass: each rollout, with the behaviour
policy's log-probabilities and the version of the weights that acted, goes to the master as one
safetensors body (`rollout_tensors`, `POST /experience`), whose reply brings the newest weights when
they changed. The master checks the body against `expected_tensors` and queues it for the learner
process (master/learning/learner_process.py), which takes `queue_size` rollouts at a time as one
`Batch` and hands them to the run's `Learner` (a3c_http/algos/ppo/algorithm.py,
a3c_http/algos/impala/algorithm.py, a3c_http/algos/apex/algorithm.py).

A learner owns the network and its optimizer on its device (`device`): one `FlatNetwork`
(a3c_http/optim/flatnet.py) as the master's parameter server has, so what it publishes (the
weights vector, the optimizer's state) is what the master serves, saves and resumes from. It
computes the values itself, so a worker sends the observation after its last step
(`last_obs`) to bootstrap from instead of values of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import torch

from a3c_http.algos.base import Algorithm, Sends, WorkerPort
from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import make_env
from a3c_http.envs.rollout import Rollout, obs_tensor
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.models.normalize import merge_moments
from a3c_http.optim.flatnet import FlatNetwork, NonFiniteStep
from a3c_http.optim.optimizers import learning_rate
from a3c_http.optim.team import SOLO, Team
from a3c_http.wire.named_tensors import Expected
from a3c_http.wire.protocol import MAX_ABS_RETURN

# The tensors of every rollout on the wire, `[T, N]` each but the observations' trailing
# dimensions; an algorithm adds the per-step tensors its learner reads (`own_tensors`).
STEP_TENSORS = ("obs", "actions", "rewards", "terminated", "truncated", "valid", "starts")
_FLOATS = (torch.float32,)


class ExperienceAlgorithm(Algorithm):
    """A worker that only acts: every rollout is pushed as it is, with up to `max_in_flight`
    (at most 1) pushes in flight while the next rollout is collected. With 0 it waits for each
    reply; with a learner that `waits_for_update` it then acts with weights at most one
    version old."""

    sends = Sends.EXPERIENCE
    bootstraps_on_worker = False  # the learner values the rollout with its own weights
    learner: ClassVar[type[Learner]]
    # The per-step tensors of its own its workers send beside STEP_TENSORS (a Rollout's
    # attribute, or an entry of its `extras`), each one its learner reads: the behaviour
    # policy's log-probabilities (PPO's ratio, IMPALA's V-trace), or Ape-X's n-step cut and
    # initial priorities.
    own_tensors: ClassVar[tuple[str, ...]] = ("log_probs",)

    @classmethod
    def expected(cls, config: TrainConfig, model: Any) -> dict[str, Expected]:
        """What a rollout of the run's workers must hold (`expected_tensors`, with the
        algorithm's `own_tensors`); an algorithm whose actions lie in the action space's Box
        (a deterministic or a squashed policy's) narrows them here."""
        return expected_tensors(config, model, cls.own_tensors)

    def pushes_in_flight(self) -> int:
        return min(self.config.max_in_flight, 1)

    def on_rollout(self, port: WorkerPort, rollout: Rollout) -> None:
        port.push_experience(rollout)


def rollout_tensors(rollout: Rollout, own: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """A rollout as the tensors of its `POST /experience` body, with the algorithm's `own`
    per-step tensors (its `own_tensors`)."""
    tensors = {name: getattr(rollout, name) for name in STEP_TENSORS}
    tensors |= {name: rollout.extras.get(name, getattr(rollout, name, None)) for name in own}
    tensors["last_obs"] = rollout.last_obs
    tensors["last_start"] = rollout.last_start
    for i, part in enumerate(rollout.state):
        tensors[f"state.{i}"] = part
    return tensors | rollout.statistics


def expected_tensors(
    config: TrainConfig, model: ActorCritic, own: tuple[str, ...]
) -> dict[str, Expected]:
    """What a rollout of `config`'s workers must hold, with the algorithm's `own` per-step
    tensors (of those named here): each tensor's shape and dtype, from one throwaway environment
    (its observations' shape and dtype, its actions') and the model (its recurrent state, its
    statistics); and what the run can produce: discrete actions that index
    the action space, log-probabilities of a discrete policy at most 0, observations inside the
    observation space where it is bounded, rewards and n-step returns within +-MAX_ABS_RETURN,
    priorities at least 0, discounts in [0, 1] and bootstrap indices within the rollout."""
    env = make_env(config.env_id, config.env_kwargs, config.preprocess, config.frame_stack)
    try:
        obs = obs_tensor(env.observation_space.sample()[None])
        observation_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()
    steps, n = config.t_max, config.num_envs
    obs_shape = tuple(obs.shape[1:])
    if isinstance(action_space, gym.spaces.Discrete):
        space = f"the action space {action_space}"
        actions = Expected((steps, n), (torch.int64,), 0, int(action_space.n) - 1, space)
        policy = "a discrete policy's log-probabilities"
        log_probs = Expected((steps, n), _FLOATS, None, 0.0, policy)
    else:  # a Gaussian policy's actions go past the bounds (the env clips), its densities past 1
        actions = Expected((steps, n, *action_space.shape), _FLOATS)
        log_probs = Expected((steps, n), _FLOATS)
    low, high = _bounds(observation_space, obs)
    shape = observation_space.shape
    within = f"the observation space (a Box of shape {shape}) widened by its width"
    rewards = "the rewards a run takes (MAX_ABS_RETURN)"
    flags = Expected((steps, n), (torch.bool,))
    expected = {
        "obs": Expected((steps, n, *obs_shape), (obs.dtype,), low, high, within),
        "actions": actions,
        "rewards": Expected((steps, n), _FLOATS, -MAX_ABS_RETURN, MAX_ABS_RETURN, rewards),
        "terminated": flags,
        "truncated": flags,
        "valid": flags,
        "starts": flags,
        "last_obs": Expected((n, *obs_shape), (obs.dtype,), low, high, within),
        "last_start": Expected((n,), (torch.bool,)),
    }
    for i, part in enumerate(model.initial_state(n)):
        expected[f"state.{i}"] = Expected(tuple(part.shape), _FLOATS)
    own_specs = {
        "log_probs": log_probs,
        "priorities": Expected((steps, n), _FLOATS, 0.0, None, "the priorities"),
        # An n-step cut (a3c_http/algos/dqn/loss.py `nstep_cut`): its return, its discount and
        # the index of the observation it bootstraps from, of `obs` followed by `last_obs`.
        "returns": Expected((steps, n), _FLOATS, -MAX_ABS_RETURN, MAX_ABS_RETURN, rewards),
        "discounts": Expected((steps, n), _FLOATS, 0.0, 1.0, "the discounts"),
        "stops": Expected((steps, n), (torch.int64,), 1, steps, "the bootstrap indices"),
    }
    expected |= {name: own_specs[name] for name in own}
    for name, buffer in model.named_buffers():
        expected[name] = Expected(tuple(buffer.shape), _FLOATS)
    return expected


def _bounds(
    space: gym.Space, obs: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A Box observation space's bounds as tensors of the observations' dtype and shape (rounded
    as the observations are: a value inside stays inside), or None where the space or its dtype
    bounds nothing. Floating-point bounds are widened by their width each way where both are
    finite: environments overstep their own a little (BipedalWalker-v3's hull angle passes pi),
    and a worker that plays one honestly is never refused; a crafted value (3e38, as an extreme
    reward's) still is."""
    if not isinstance(space, gym.spaces.Box) or tuple(space.shape) != tuple(obs.shape[1:]):
        return None, None
    if obs.dtype == torch.bool:
        return None, None
    low = torch.as_tensor(space.low).to(obs.dtype)
    high = torch.as_tensor(space.high).to(obs.dtype)
    if obs.is_floating_point():
        bounded = bool(torch.isfinite(low).any() or torch.isfinite(high).any())
        width = high - low
        width = torch.where(torch.isfinite(width), width, torch.zeros_like(width))
        low, high = low - width, high + width
    else:  # an integer dtype bounds its values itself
        info = torch.iinfo(obs.dtype)
        bounded = bool((low > info.min).any() or (high < info.max).any())
    return (low, high) if bounded else (None, None)


@dataclass
class Batch:
    """`queue_size` rollouts of an actor-critic's (`log_probs` among their own tensors: PPO's,
    IMPALA's) side by side (`[T, N_total]`), on the learner's device."""

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    valid: torch.Tensor
    starts: torch.Tensor
    last_obs: torch.Tensor
    last_start: torch.Tensor
    state: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, rollouts: list[dict[str, torch.Tensor]], device: torch.device) -> Batch:
        def joined(name: str, dim: int = 1) -> torch.Tensor:
            return torch.cat([r[name] for r in rollouts], dim=dim).to(device)

        parts = sum(1 for name in rollouts[0] if name.startswith("state."))
        return cls(
            **{name: joined(name) for name in (*STEP_TENSORS, "log_probs")},
            last_obs=joined("last_obs", 0),
            last_start=joined("last_start", 0),
            state=tuple(joined(f"state.{i}", 0) for i in range(parts)),
        )

    def split(self, parts: int) -> list[Batch]:
        """The batch's environments in `parts` groups of nearly equal size, each a Batch of
        whole rollouts in time order. `parts` is at most the environments (the config's
        `minibatches` check); 1 is the batch itself, not a copy."""
        if parts == 1:
            return [self]
        groups = torch.arange(self.obs.shape[1]).tensor_split(parts)
        return [
            Batch(
                **{name: getattr(self, name)[:, envs] for name in (*STEP_TENSORS, "log_probs")},
                last_obs=self.last_obs[envs],
                last_start=self.last_start[envs],
                state=tuple(part[envs] for part in self.state),
            )
            for envs in groups
        ]

    def unroll(self, model: ActorCritic) -> tuple[Any, torch.Tensor]:
        """The policy's distributions over the batch's steps `[T, N]` and its values over them
        and the observation after them (`[T + 1, N]`), in time order from the batch's state."""
        obs = torch.cat([self.obs, self.last_obs.unsqueeze(0)])
        starts = torch.cat([self.starts, self.last_start.unsqueeze(0)])
        dist, values = model.unroll(obs, self.state, starts)
        return dist, values


class Learner:
    """The learner's side of an experience algorithm: the network and its optimizer on `device`,
    and `learn`, one update from a batch of rollouts. Subclasses implement `update`.

    `waits_for_update`: in a run whose workers wait for each reply (`max_in_flight` 0), the
    master holds every reply until the update that takes its rollout is published, so every
    worker acts with the newest weights (synchronous PPO). False, or with a push in flight:
    pushes are answered at once and the algorithm corrects for the lag."""

    waits_for_update: ClassVar[bool] = False
    adam_eps: ClassVar[float] = 1e-8  # with optimizer "adam": torch's default epsilon

    def __init__(
        self,
        config: TrainConfig,
        model: ActorCritic,
        device: torch.device,
        optimizer_state: dict[str, Any] | None = None,
        *,
        team: Team = SOLO,
    ) -> None:
        """`model` holds the weights to start from (the master's); it is moved to `device`.
        `team`: the run's other learners (a3c_http/optim/team.py), whose gradients each step
        averages with this one's; alone by default."""
        self.config = config
        self.device = device
        self.team = team
        self.net = FlatNetwork(model.to(device), config, optimizer_state, self.adam_eps)
        self.model = self.net.model
        # Backpropagation writes the gradients into one vector (each parameter's .grad a view of
        # its region, in the layout's order), which the flat optimizer steps as it is.
        self._grads = torch.zeros(self.net.layout.numel, device=device)
        offset = 0
        for p in self.model.parameters():
            p.grad = self._grads[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.updates = 0
        self.nonfinite_steps = 0  # optimizer steps undone (NonFiniteStep)
        self._statistics = self.net.layout.numel > self.net.layout.n_params

    @classmethod
    def queue_capacity(cls, config: TrainConfig) -> int:
        """How many rollouts may wait for the learner (taken or on their way) before the
        master holds the workers' next pushes: two updates' worth, so that the next batch is
        there when an update ends."""
        return 2 * config.queue_size

    def learn(
        self, rollouts: list[dict[str, torch.Tensor]], env_steps: int
    ) -> dict[str, float] | None:
        """One update from `rollouts` (as `rollout_tensors` made them), `env_steps` into the run
        (the schedules' progress). Returns the training metrics under SB3's names, or None when
        the weights did not change (a replay still filling, or no valid step to learn from).

        In a team every learner is handed the update's rollouts, all of them, and learns from
        its share (`share`); what they decide from the rollouts (whether any step is valid, the
        observations' statistics) they decide from all, so alike."""
        if not any(bool(r["valid"].any()) for r in rollouts):
            return None
        if self._statistics:  # every rollout's observations count, as SB3's VecNormalize
            for rollout in rollouts:
                merge_moments(self.model, {k: v.to(self.device) for k, v in rollout.items()})
        lr = learning_rate(self.config, env_steps)
        for group in self.net.optimizer.param_groups:
            group["lr"] = lr
        metrics = self.update(Batch.of(self.share(rollouts), self.device), env_steps)
        self.updates += 1
        return {**metrics, "train/learning_rate": lr, "train/n_updates": float(self.updates)}

    def share(self, rollouts: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        """This learner's share of an update's rollouts: in a team, the rank-th of `team.size`
        nearly equal groups of the update's environments (every rollout's, one after the other),
        each rollout cut to those of its environments in the group (and left out with none); the
        rollouts as they are alone. `learners` is at most the update's environments: every
        learner has one at least."""
        if self.team.size == 1:
            return rollouts
        counts = [r["valid"].shape[1] for r in rollouts]
        group = torch.arange(sum(counts)).tensor_split(self.team.size)[self.team.rank]
        mine, offset = [], 0
        for rollout, n in zip(rollouts, counts, strict=True):
            envs = group[(group >= offset) & (group < offset + n)] - offset
            if len(envs):
                steps = rollout["valid"].shape
                mine.append({k: _environments(k, t, envs, steps) for k, t in rollout.items()})
            offset += n
        return mine

    def update(self, batch: Batch, env_steps: int) -> dict[str, float]:
        raise NotImplementedError

    def restore_target(self, vector: torch.Tensor) -> None:
        """Start from a saved target network (learners that keep one: Ape-X's)."""

    def take_target(self) -> torch.Tensor | None:
        """The target network when it changed since the last call; None without one."""
        return None

    def step(self, loss: torch.Tensor | None) -> float:
        """Backpropagate `loss` (None: this learner has no step of its share to learn from, and
        adds no gradient to its team's), average the gradients over the team, clip them to
        max_grad_norm and take one optimizer step on the flat network (undone, and counted, if
        it would leave a value non-finite). Returns the gradients' norm before clipping."""
        self._grads.zero_()
        if loss is not None:
            loss.backward()  # into the parameters' .grad: views of `_grads`
        self.team.average(self.net.gradient(self._grads))
        grads, limit = self.net.gradient(self._grads), self.config.max_grad_norm
        norm = float(torch.linalg.vector_norm(grads))
        if not norm <= limit:  # clip_grad_norm_'s scaling (a non-finite norm spoils the step)
            grads.mul_(limit / (norm + 1e-6))
        # A norm that is not finite leaves the step to be checked after it, and undone.
        checked = min(norm, limit) if math.isfinite(norm) else None
        try:
            self.net.step([self._grads], 1.0, checked)
        except NonFiniteStep:
            self.nonfinite_steps += 1
        return norm

    def weights(self) -> torch.Tensor:
        """The weights and statistics to publish: a float32 vector on the CPU."""
        return self.net.flat.detach().to("cpu", copy=True)

    def copy_weights(self, out: torch.Tensor) -> None:
        """Copy the weights and statistics into `out` (a float32 vector on the CPU, such as the
        one the learner shares with the master), in one copy from the learner's device."""
        out.copy_(self.net.flat.detach())

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state on the CPU, as the master saves it."""
        state = self.net.optimizer_state()
        return {
            "state": {
                k: {n: (v.cpu() if torch.is_tensor(v) else v) for n, v in s.items()}
                for k, s in state["state"].items()
            },
            "param_groups": state["param_groups"],
        }


def _environments(
    name: str, tensor: torch.Tensor, envs: torch.Tensor, steps: torch.Size
) -> torch.Tensor:
    """The environments `envs` of a rollout's tensor: its first dimension for the last
    observation and the recurrent state (`[N, ...]`), its second for a per-step tensor (any
    other of shape `steps`, `[T, N]`, and more); the statistics are the rollout's as they are."""
    if name in ("last_obs", "last_start") or name.startswith("state."):
        return tensor[envs]
    if tuple(tensor.shape[:2]) == tuple(steps):
        return tensor[:, envs]
    return tensor


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - predicted) / Var(target), as SB3 reports it (nan for a constant target)."""
    var = float(target.var()) if target.numel() > 1 else 0.0
    if var == 0:
        return float("nan")
    return 1.0 - float((target - predicted).var()) / var
