"""Building gymnasium environments, and what to say when one cannot be built: an id that is not
registered (a close match, or how a custom environment is named) or a package it needs that is
not installed (which of this project's extras brings it).

The master (sizing the network of a run, evaluating), the workers (their rollouts), the learner in
one process and scripts/evaluate.py build every environment through `make_env` (or `env_for`, a
run's config), so they all see the same wrappers and a missing package reads the same in
`POST /train`'s 422, in a worker's error and in scripts/evaluate.py. What it adds:

- `preprocess: "atari"`: gymnasium's `AtariPreprocessing` as the DQN and A3C papers (up to 30
  no-op actions after a reset, 4 frames a step with the last two max-pooled, 84x84 grayscale
  uint8); the environment is made with `frameskip=1` so that the wrapper does the skipping.
- `frame_stack: k > 1`: the last k observations as channels (`StackFrames`, what gymnasium's
  `FrameStackObservation(k)` gives, with less copying).
- always, outermost: `RecordEpisodeStatistics`, whose `episode` info is the episode's true return
  and length (before any clipping the loss does, and over lives, not per life).

Observations keep their own dtype: uint8 frames stay uint8 until the network scales them.
The families of environments that live in packages of their own are registered here on first use
(`register_family`): `ALE/...` (the `atari` extra), `MinAtar/...` (the `minatar` extra), and this
project's own small tasks (`a3c_http/...`, a3c_http/envs/tasks.py).

An environment of a user's module is named `module:Name`. Importing `module` registers `Name`
(gymnasium's own convention), or, where it registers no such id, `module` defines `Name`: a
gymnasium.Env subclass or a function that returns an environment (an entry point), which
`register_entry_point` registers under `Name` (no time limit, no reward_threshold) in every process
that validates or makes the environment: the master, the workers, the master's evaluation process,
a3c-evaluate, a3c-export and a3c_http.api. The module is imported only when it is allowed: listed in
A3C_ENV_MODULES, or by this process itself (`allow_modules`, what a3c_http.api's `load_policy` is
told).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers import AtariPreprocessing, RecordEpisodeStatistics

from a3c_http.config.hints import close_matches, did_you_mean

# The families of gymnasium's environments that need packages of their own, by the module of
# their entry point: the extra of this project that installs them, and what it holds.
EXTRAS = {
    "gymnasium.envs.box2d": ("box2d", "box2d-py, pygame"),
    "ale_py": ("atari", "ale-py, opencv-python-headless"),
    "minatar": ("minatar", "MinAtar"),
}
# Namespaces of ids that a package registers: the module to import and the function of it to
# call (None: importing it registers them). A package missing is said with its EXTRAS entry.
FAMILIES = {
    "ALE": ("ale_py", None),
    "MinAtar": ("minatar.gym", "register_envs"),
    "a3c_http": ("a3c_http.envs.tasks", "register"),
}
_registered: set[str] = set()
# Modules this process allows to register environments beside A3C_ENV_MODULES (`allow_modules`).
_allowed_here: set[str] = set()


class MissingDependency(gym.error.DependencyNotInstalled):
    """An environment needs a package that is not installed; the message says how to install it
    in this project (gymnasium's own says `pip install "gymnasium[...]"`, which is not how our
    venv is made)."""


def make_env(
    env_id: str,
    env_kwargs: dict[str, Any],
    preprocess: str = "none",
    frame_stack: int = 1,
    **options: Any,
) -> gym.Env:
    """`gymnasium.make(env_id, **env_kwargs, **options)` with the wrappers asked for (the
    module's docstring); a missing package raises MissingDependency with what to install."""
    register_family(env_id)
    module, _, name = env_id.rpartition(":")
    if module and name not in gym.registry:
        # gymnasium.make imports the module itself; an entry point is registered here first (a
        # process that never validated a config, e.g. the master's evaluation process).
        register_entry_point(module, name)
    try:
        if preprocess == "atari":
            env = AtariPreprocessing(gym.make(env_id, **{"frameskip": 1, **env_kwargs}, **options))
        else:
            env = gym.make(env_id, **env_kwargs, **options)
    except gym.error.DependencyNotInstalled as exc:
        if isinstance(exc, MissingDependency):
            raise
        raise MissingDependency(missing_dependency(env_id, exc)) from None
    if frame_stack > 1:
        env = StackFrames(env, frame_stack)
    return RecordEpisodeStatistics(env)


class StackFrames(gym.ObservationWrapper):
    """gymnasium's `FrameStackObservation(env, k)` (the last k observations, oldest first, the
    first one repeated after a reset), in a buffer of its own that each step shifts in place:
    gymnasium's copies each frame and stacks them anew, a fifth of a MinAtar rollout's time."""

    def __init__(self, env: gym.Env, k: int) -> None:
        super().__init__(env)
        space = env.observation_space
        self.observation_space = batch_space(space, k)
        self._frames = np.zeros((k, *space.shape), dtype=space.dtype)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._frames[:] = obs
        return self._frames.copy(), info

    def observation(self, observation: Any) -> np.ndarray:
        self._frames[:-1] = self._frames[1:]
        self._frames[-1] = observation
        return self._frames.copy()


def env_for(config: Any, **options: Any) -> gym.Env:
    """The environment of a run's config (a3c_http/config/training.py TrainConfig), with its
    wrappers."""
    return make_env(
        config.env_id, config.env_kwargs, config.preprocess, config.frame_stack, **options
    )


def register_family(env_id: str) -> None:
    """Register the environments of `env_id`'s namespace (`ALE/Pong-v5`: ale-py's) if a package
    of their own holds them; MissingDependency says which extra installs it."""
    namespace, _, _ = env_id.rpartition(":")[2].rpartition("/")
    if namespace not in FAMILIES or namespace in _registered:
        return
    module_name, register = FAMILIES[namespace]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = EXTRAS[module_name.partition(".")[0]]
        raise MissingDependency(_install(env_id, *extra) + f" ({exc})") from None
    if register is not None:
        getattr(module, register)()
    _registered.add(namespace)


def missing_dependency(env_id: str, exc: Exception) -> str:
    """What to install for `env_id`, whose making raised `exc` (DependencyNotInstalled)."""
    try:
        entry_point = str(gym.spec(env_id).entry_point)
    except gym.error.Error:
        entry_point = ""
    for module, extra in EXTRAS.items():
        if entry_point.startswith((module + ".", module + ":")):
            return _install(env_id, *extra)
    return f"{env_id} needs a package that is not installed here: {exc}"


def _install(env_id: str, extra: str, packages: str) -> str:
    return (
        f"{env_id} needs the packages of the {extra} extra ({packages}), which are not "
        f"installed here: run ./scripts/setup_venv.sh {extra} (or pip install "
        f"'a3c-http[{extra}]') on the master and on every worker"
    )


def unknown_env(name: str, module: str | None = None) -> str:
    """Why `name` is not a registered environment, and what the user may have meant."""
    message = f"unknown gymnasium environment {name!r}"
    if module:
        message += (
            f" (importing {module!r} did not register it, and {module!r} defines no "
            "gymnasium.Env class or function of that name)"
        )
    matches = close_matches(name, gym.registry, n=1, cutoff=0.8)
    if matches:
        return f"{message}; {did_you_mean(matches)}"
    if module:
        return message
    return (
        f"{message}. A custom environment is named module:EnvName-v0, where importing module "
        "registers it, and module must be listed in A3C_ENV_MODULES on the master and on every "
        "worker (e.g. env_id 'my_envs:MyEnv-v0' with A3C_ENV_MODULES=my_envs)"
    )


def listed_modules() -> list[str]:
    """The modules A3C_ENV_MODULES lists (comma-separated) in this process's environment."""
    return [m.strip() for m in os.environ.get("A3C_ENV_MODULES", "").split(",") if m.strip()]


def allowed_modules() -> list[str]:
    """The modules allowed to register environments here: A3C_ENV_MODULES's (`listed_modules`),
    and those this process allowed itself (`allow_modules`)."""
    listed = listed_modules()
    return listed + sorted(_allowed_here.difference(listed))


def allow_modules(modules: Iterable[str]) -> None:
    """Allow `modules` to register environments in this process, as if A3C_ENV_MODULES listed
    them (for a caller that names them itself: a3c_http.api's `load_policy`)."""
    _allowed_here.update(m.strip() for m in modules if m.strip())


def register_entry_point(module: str, name: str) -> bool:
    """Register `name` with the attribute `name` of the imported `module` as its entry point,
    when that attribute is a gymnasium.Env subclass or a function (that makes an environment) and
    `name` is not registered yet; whether `name` is registered now. Nothing else is registered:
    no time limit, no reward_threshold (a module that registers its id itself gives them)."""
    if name in gym.registry:
        return True
    target = getattr(importlib.import_module(module), name, None)
    is_env = inspect.isclass(target) and issubclass(target, gym.Env)
    if not is_env and not (callable(target) and not inspect.isclass(target)):
        return False
    gym.register(name, entry_point=f"{module}:{name}")
    return True


def _no_such_module(module: str) -> str | None:
    """What to say of a module not allowed that this host does not have at all (a misspelt one,
    most often): its top-level package is looked for, never imported, so nothing of it runs."""
    top = module.partition(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    close = difflib.get_close_matches(module, allowed_modules(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return (
        f"no module named {top!r} on this host{hint} (an environment's module must be installed, "
        "and listed in A3C_ENV_MODULES, on the master and every worker)"
    )


def env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registered spec of `env_id`. An id of the form `module:EnvName-v0` first imports
    `module` (which registers the environment, as `gymnasium.make` does, or defines it:
    `register_entry_point`), but only when the module is allowed (`allowed_modules`:
    A3C_ENV_MODULES): a training request must not import arbitrary code."""
    module, _, name = env_id.rpartition(":")
    if module:
        if module not in allowed_modules():
            missing = _no_such_module(module)
            if missing is not None:
                raise ValueError(missing)
            raise ValueError(
                f"module {module!r} is not in A3C_ENV_MODULES, the comma-separated list of modules "
                "allowed to register environments (set it on the master and every worker)"
            )
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"cannot import {module!r}: {exc}") from None
        register_entry_point(module, name)
    try:
        register_family(name)
    except MissingDependency as exc:
        raise ValueError(str(exc)) from None
    if name not in gym.registry:
        raise ValueError(unknown_env(name, module or None))
    return gym.spec(name)
