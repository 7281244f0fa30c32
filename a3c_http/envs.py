"""Building gymnasium environments, and what to say when one cannot be built: an id that is not
registered (a close match, or how a custom environment is named) or a package it needs that is
not installed (which of this project's extras brings it).

The master (sizing the network of a run, evaluating) and the workers (their rollouts) build every
environment through `make_env`, so a missing package reads the same in `POST /train`'s 422, in a
worker's error and in scripts/evaluate.py.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from a3c_http.hints import close_matches, did_you_mean

# The families of gymnasium's environments that need packages of their own, by the module of
# their entry point: the extra of this project that installs them, and what it holds.
EXTRAS = {"gymnasium.envs.box2d": ("box2d", "box2d-py, pygame")}


class MissingDependency(gym.error.DependencyNotInstalled):
    """An environment needs a package that is not installed; the message says how to install it
    in this project (gymnasium's own says `pip install "gymnasium[...]"`, which is not how our
    venv is made)."""


def make_env(env_id: str, env_kwargs: dict[str, Any], **options: Any) -> gym.Env:
    """`gymnasium.make(env_id, **env_kwargs, **options)`; a missing package raises
    MissingDependency with what to install."""
    try:
        return gym.make(env_id, **env_kwargs, **options)
    except gym.error.DependencyNotInstalled as exc:
        if isinstance(exc, MissingDependency):
            raise
        raise MissingDependency(missing_dependency(env_id, exc)) from None


def missing_dependency(env_id: str, exc: Exception) -> str:
    """What to install for `env_id`, whose making raised `exc` (DependencyNotInstalled)."""
    try:
        entry_point = str(gym.spec(env_id).entry_point)
    except gym.error.Error:
        entry_point = ""
    for module, (extra, packages) in EXTRAS.items():
        if entry_point.startswith(module + "."):
            return (
                f"{env_id} needs the packages of the {extra} extra ({packages}), which are not "
                f"installed here: run ./scripts/setup_venv.sh {extra} (or pip install "
                f"'a3c-http[{extra}]') on the master and on every worker"
            )
    return f"{env_id} needs a package that is not installed here: {exc}"


def unknown_env(name: str, module: str | None = None) -> str:
    """Why `name` is not a registered environment, and what the user may have meant."""
    message = f"unknown gymnasium environment {name!r}"
    if module:
        message += f" (importing {module!r} did not register it)"
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
