"""The seam between the cluster and its algorithms.

An algorithm is a room: what a worker does with each rollout and sends, and what the master does
with what arrives. The plumbing around it (collecting rollouts, the wire, the transport, admission,
versions, persistence, the views) is shared and knows no algorithm by name: the worker's trainer
and the master's state ask the run's algorithm (a3c_http/algos/registry.py, by the config's
`algo`) and never branch on its name themselves.

What an algorithm sends (`Sends`) decides which of the cluster's two data flows it uses:

- GRADIENTS, gradients up and weights down: a worker computes an update from its own data and
  pushes it (`WorkerPort.push_gradients`); the master admits it (registered, fresh enough, not an
  outlier, finite) and its algorithm's `apply` hands it to the parameter server, which steps its
  one optimizer now (A3C) or once a round is complete (sync A2C). Algorithms whose workers push
  several updates a rollout (DPPO's minibatches) or updates from their own replay against a
  target network (asynchronous DQN, Gorila) push the same way.
- WEIGHTS: a worker learns on its own and sends its weights (the original design's best
  weights), through `WorkerPort.push_weights`.
- EXPERIENCE (the learner's algorithms: PPO, IMPALA, Ape-X): a worker only acts and sends its
  rollouts, with the version that acted and the per-step tensors its learner reads (the behaviour
  policy's log-probabilities, Ape-X's initial priorities: `ExperienceAlgorithm.own_tensors`),
  through `WorkerPort.push_experience`, to a learner beside the master (a3c_http/algos/learner.py).
  A run's data flow is its algorithm's `sends` (`registry.learns_from_experience`).

A worker's algorithm object lives as long as the worker's run (it may keep state: an optimizer,
a replay); the master's side is stateless (`apply` is a class method), since what persists is the
parameter server's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Literal, Protocol

import torch
from torch import nn

from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import Episode, Rollout
from a3c_http.models.actor_critic import build_model


class Sends(StrEnum):
    """What a worker of an algorithm sends the master."""

    GRADIENTS = "gradients"
    WEIGHTS = "weights"
    EXPERIENCE = "experience"


@dataclass
class GradientUpdate:
    """An update a worker computed, ready to push: the gradients by parameter name (every
    parameter, clipped), the loss they came from and their global norm before clipping (the
    master's outlier check judges both), and the training metrics under SB3's names."""

    gradients: dict[str, torch.Tensor]
    loss: float
    norm: float
    metrics: dict[str, float] = field(default_factory=dict)


def gradients(
    model: nn.Module, loss: torch.Tensor, max_grad_norm: float
) -> tuple[dict[str, torch.Tensor], float]:
    """Backpropagate `loss`, clip to `max_grad_norm` and return the gradients by parameter name
    (zeros for parameters the loss does not reach, so every push has the same names) and their
    global L2 norm before clipping."""
    model.zero_grad(set_to_none=True)
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    grads = {
        name: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        for name, p in model.named_parameters()
    }
    return grads, float(norm)


class WorkerPort(Protocol):
    """What a worker's trainer (worker/trainer.py) offers its algorithm. Each call may raise the
    trainer's own stop signal when the master ended the run; an algorithm lets it through."""

    version: int  # the version of the global weights the worker holds

    def push_gradients(self, update: GradientUpdate, rollout: Rollout, wait_s: float) -> None:
        """Send `update` with the rollout's finished episodes and statistics (one push, which
        may stay in flight while the next rollout is collected: `Algorithm.pushes_in_flight`),
        and load the newest weights the replies that are in bring. `wait_s`: how long the
        master may hold the reply (a sync round)."""

    def report_episodes(self, episodes: list[Episode]) -> bool:
        """Report finished episodes one by one; True when one of them raised the best score."""

    def push_experience(self, rollout: Rollout) -> None:
        """Send the rollout itself to the learner beside the master (with its finished episodes
        and the worker's statistics), and load the newest weights the replies that are in
        bring."""

    def push_weights(self, temporary: bool) -> None:
        """Send this worker's weights: as the new global weights, or (temporary) to its slot."""

    def pull_weights(self) -> None:
        """Load the global weights if they are newer than this worker's."""

    def target_weights(self, if_not_version: int | None) -> Any:
        """The run's target network (a3c_http/net/replies.py `Weights`: its vector and version),
        or None when it is still at `if_not_version` (algo dqn)."""

    def learning(self) -> contextlib.AbstractContextManager[None]:
        """Count the time spent in the block as learning (the worker's /status)."""

    def note_metrics(self, metrics: dict[str, float]) -> None:
        """The latest training metrics, for the worker's /status and the master's views."""


class ParameterServerPort(Protocol):
    """What the master's parameter server (master/learning/parameter_server.py) offers an
    algorithm for an admitted gradient update; each returns the push's outcome (the new weights
    now, or once its round closes) or raises the master's refusal."""

    def apply_gradients(self, update: Any, config: TrainConfig, refusal: Any) -> Any: ...

    def join_round(
        self, update: Any, config: TrainConfig, refusal: Any, expected: set[str]
    ) -> Any: ...


class Algorithm:
    """One algorithm of the cluster. Subclasses set `name` (the config's `algo` that selects
    it; its section, a3c_http/algos/<algo>/config.py, names the class) and `sends`, and
    implement `on_rollout`; the rest has the plain gradient-pushing defaults. What the cluster's
    shared code needs to know of an algorithm it asks the class (`model`, `sends`, `plays`,
    `target_network`, `target_refresh_every`, `epsilon_of`), never its name."""

    name: ClassVar[str]
    sends: ClassVar[Sends]
    # How the run's policy is played wherever it is judged and used: the master's evaluations,
    # a3c-evaluate, a3c-export and load_policy. "sample": as it samples (an actor-critic's
    # stochastic policy, what its training episodes played), each draw from seeded noise, so
    # that an evaluation and an exported file given the same noise play alike; "greedy": the
    # most likely action (a Q-network's highest value), judged on evaluations (`solved_on`).
    plays: ClassVar[Literal["sample", "greedy"]] = "sample"
    # Whether a worker's rollout carries the value after its last step (`Rollout.last_value`,
    # A3C's bootstrap); False where a learner values the rollout itself, so that the worker
    # spares that forward pass (a sixth of an IMPALA MinAtar worker's).
    bootstraps_on_worker: ClassVar[bool] = True
    # Whether the master keeps a target network of the run beside its weights (saved and
    # served with them: the value-based algorithms').
    target_network: ClassVar[bool] = False

    @classmethod
    def model(cls, config: TrainConfig) -> nn.Module:
        """The network a run of the algorithm trains, as `config` describes it: the master, the
        workers, the learner and evaluation all build it here (a3c_http/algos/registry.py
        `model_for`), so they agree on every name and shape. The actor-critic of
        a3c_http/models/actor_critic.py unless the algorithm has a network of its own."""
        return build_model(
            config.env_id,
            config.env_kwargs,
            config.hidden_sizes,
            preprocess=config.preprocess,
            frame_stack=config.frame_stack,
            shared_torso=config.shared_torso,
            log_std_init=config.log_std_init,
            normalize_obs=config.normalize_obs,
            normalize_reward=config.normalize_reward,
            encoder=config.encoder,
            core=config.core,
            lstm_size=config.lstm_size,
            lstm_first=config.lstm_first,
        )

    @classmethod
    def target_refresh_every(cls, config: TrainConfig) -> int | None:
        """How many versions apart the master's parameter server refreshes the run's target
        network itself (asynchronous DQN's); None: it keeps none of its own (an algorithm
        without one, or whose learner refreshes its own)."""
        return None

    @classmethod
    def epsilon_of(cls, config: TrainConfig, share: float) -> float | None:
        """The exploration epsilon of the worker at `share` (0 to 1) of the spread over the
        workers (a3c_http/algos/exploration.py `derive`); None: the workers of the algorithm
        have no epsilon of their own."""
        return None

    @classmethod
    def own_epsilon(cls, epsilon: float) -> dict[str, Any]:
        """The config fields that carry a worker's own `epsilon_of` into its copy of the config
        (a3c_http/algos/exploration.py `Exploration.config_for`)."""
        return {}

    def __init__(self, config: TrainConfig, model: nn.Module, policy: Any) -> None:
        """`model` is the worker's network (its weights are what the master's replies load);
        `policy` what acts and is scored: the model, or its widened Gaussian
        (a3c_http/algos/exploration.py)."""
        self.config = config
        self.model = model
        self.policy = policy

    # -- the worker's side ----------------------------------------------------------------------

    def pushes_in_flight(self) -> int:
        """The most pushes a worker keeps on the wire while it collects its next rollout."""
        return 0

    def on_rollout(self, port: WorkerPort, rollout: Rollout) -> None:
        """Do with one rollout what this algorithm does on a worker, through `port`."""
        raise NotImplementedError

    def on_heartbeat(self, port: WorkerPort) -> None:
        """After each heartbeat the worker sends (when no reply came for a while)."""

    # -- the master's side ----------------------------------------------------------------------

    @classmethod
    def apply(
        cls,
        server: ParameterServerPort,
        update: Any,
        config: TrainConfig,
        refusal: Any,
        expected: Callable[[], set[str]],
    ) -> Any:
        """Hand an admitted gradient update to the parameter server: applied at once. `refusal`
        is the run's reason to refuse any update (the server raises it unless the push is a
        retry); `expected()` the running workers a round would wait for."""
        return server.apply_gradients(update, config, refusal)
