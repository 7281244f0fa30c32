"""A trained policy in this process, without the services: `load_policy(run folder)`, or a run's
`Run.policy()` (a3c_http/api/run.py), which also takes it from a running master.

`Policy.act` takes raw observations, as the run's environment (with its wrappers:
`Policy.make_env`) returns them: the running statistics of a normalising run are buffers of the
network and applied inside it, as on the workers and in the project's evaluation. A recurrent
policy (config `core: "lstm"`) carries its state through the caller: `initial_state()` before an
episode, then the state `act` returns. A3C, PPO and IMPALA runs act with their actor-critic,
DQN and Ape-X runs with their Q-network (the action of highest Q-value); each plays as its run's
algorithm plays it (`Policy.plays`), unless `act` is told otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from pydantic import ValidationError

from a3c_http.algos.registry import algorithm_class
from a3c_http.api.errors import TrainError
from a3c_http.config.files import RunFolderError, read_run, saved_config
from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import MissingDependency, allow_modules, env_for
from a3c_http.envs.rollout import obs_tensor
from a3c_http.models.actor_critic import State
from a3c_http.policy.evaluation import EvalResult, evaluate, load_model
from a3c_http.server.service import describe_error
from a3c_http.wire import tensors as wire

__all__ = ["Policy", "load_policy"]


class Policy:
    """A run's network, acting on raw observations (the module's docstring).

    `config`: the run's resolved training config; `recurrent`: whether `act` carries a state;
    `observation_space`, `action_space`: those of `make_env()`'s environment."""

    def __init__(self, config: TrainConfig, weights: bytes, run_id: str | None = None) -> None:
        self.config = config
        self.run_id = run_id
        self._weights = weights
        try:
            self.model = load_model(config, weights)
        except wire.WireError as exc:
            raise TrainError(f"the weights do not fit the run's network: {exc}") from None
        env = self.make_env()
        try:
            self.observation_space = env.observation_space
            self.action_space = env.action_space
        finally:
            env.close()
        self.recurrent = bool(getattr(self.model, "recurrent", False))
        self.plays = algorithm_class(config).plays  # "sample" or "greedy"

    @property
    def env_id(self) -> str:
        return self.config.env_id

    def make_env(self, **options: Any) -> gym.Env:
        """A new environment of the run, with the wrappers its config asks for (what the workers
        stepped); `options` go to gymnasium.make, e.g. `render_mode="rgb_array"`."""
        try:
            return env_for(self.config, **options)
        except MissingDependency as exc:
            raise TrainError(str(exc)) from None

    def initial_state(self, n: int = 1) -> State:
        """The state before the first step of `n` environments' episodes: zeros, or `()` for a
        feed-forward network (then `act` needs none)."""
        return self.model.initial_state(n)

    @torch.no_grad()
    def act(
        self,
        obs: Any,
        state: State | None = None,
        deterministic: bool | None = None,
        noise: Any = None,
    ) -> tuple[Any, State]:
        """The action for one observation (as the environment returns it) or a batch of them
        (a leading dimension), and the state after it. `state`: what the last call returned, or
        None at an episode's start (the initial state). `deterministic`: True, the most likely
        action (the Gaussian's mean, the highest Q-value); False, one drawn from the policy;
        None, as the run's algorithm plays its policy (`plays`: an actor-critic's drawn, a
        Q-network's greedy), the policy its run was judged on. `noise`: what draws a drawn action
        (`ActorCritic.drawn`, as an exported file takes it: one uniform number in [0, 1) per
        observation for a discrete action, standard normals per action dimension for a Box), so
        that the evaluation's noise (a3c_http/policy/evaluation.py `episode_noise`) plays its
        episodes; None: a fresh draw. The action fits the action space: an int (a numpy array of
        them for a batch) for Discrete, an array clipped to the Box for Box."""
        if deterministic is None:
            deterministic = self.plays == "greedy"
        array = np.asarray(obs)
        shape = tuple(self.observation_space.shape or ())
        single = array.shape == shape
        if not single and array.shape[1:] != shape:
            raise ValueError(
                f"obs has shape {array.shape}: expected {shape} (one observation) or "
                f"(batch, *{shape})"
            )
        batch = obs_tensor(array[None] if single else array)
        if state is None:
            state = self.initial_state(batch.shape[0])
        dist, _, state = self.model.act(batch, state)
        if deterministic:
            actions = self.model.greedy(dist)
        elif noise is None:
            actions = dist.sample()
        else:
            draws = torch.as_tensor(np.asarray(noise, dtype=np.float32))
            actions = self.model.drawn(dist, draws[None] if single else draws)
        fitted = self._fit(actions.numpy())
        if not single:
            return fitted, state
        return (int(fitted[0]) if fitted.ndim == 1 and self.model.discrete else fitted[0]), state

    def _fit(self, actions: np.ndarray) -> np.ndarray:
        """The network's actions as the environment takes them (a3c_http/policy/evaluation.py)."""
        space = self.action_space
        if isinstance(space, gym.spaces.Box):
            return np.clip(actions, space.low, space.high).astype(space.dtype)
        return actions.astype(np.int64)

    def play(self, episodes: int = 1, seed: int | None = None, **options: Any) -> list[float]:
        """The returns of `episodes` episodes on `make_env(**options)`, the policy played as its
        run plays it (`act`), the first reset with `seed`: the loop a user writes, for a quick
        look (render with `render_mode="human"` where the environment can)."""
        env = self.make_env(**options)
        returns = []
        try:
            for episode in range(episodes):
                obs, _ = env.reset(seed=None if seed is None or episode else seed)
                state, total, done = None, 0.0, False
                while not done:
                    action, state = self.act(obs, state)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    total += float(reward)
                    done = terminated or truncated
                returns.append(total)
        finally:
            env.close()
        return returns

    def evaluate(self, episodes: int = 10) -> EvalResult:
        """The project's evaluation of these weights (what the master's evaluations and
        a3c-evaluate report): `episodes` episodes played as the run plays its policy, seeded
        from the run's seed (a3c_http/policy/evaluation.py)."""
        try:
            return evaluate(self.config, self._weights, episodes)
        except MissingDependency as exc:
            raise TrainError(str(exc)) from None

    def __repr__(self) -> str:
        kind = "recurrent " if self.recurrent else ""
        return f"<Policy {kind}{self.config.algo} {self.env_id} run={self.run_id}>"


def load_policy(folder: str | Path, env_modules: Iterable[str] = ()) -> Policy:
    """The policy of a run folder (its last saved weights and config), without any service
    running. `env_modules`: the modules allowed to make the run's environment here besides
    A3C_ENV_MODULES (for `webcrawl:WebCrawl-v0`: `["webcrawl"]`); each must be importable here
    (installed, or its folder on sys.path). Raises TrainError with one line saying what is
    wrong."""
    allow_modules(env_modules)
    try:
        config, snap = read_run(Path(folder))
    except RunFolderError as exc:
        raise TrainError(str(exc)) from None
    return Policy(config.resolved(), snap.weights or b"", snap.state.get("run_id"))


def policy_of(config: dict[str, Any], weights: bytes, run_id: str | None) -> Policy:
    """The policy of a saved config (config.json's fields, or /status's `config`) and weights."""
    try:
        resolved = saved_config({k: v for k, v in config.items() if k != "run_id"}).resolved()
    except ValidationError as exc:
        raise TrainError(
            "the run's config does not load here: " + describe_error(exc.errors()[0], "config")
        ) from None
    return Policy(resolved, weights, run_id)
