"""What `train`'s `env` names, as the master and the workers can make it (`resolve`): an env_id for
`POST /train`, the modules that must be allowed there (A3C_ENV_MODULES) and the folders that hold
them here (what a local cluster's processes get on PYTHONPATH, so that they import the modules as
this process does).

- a gymnasium id (`"CartPole-v1"`, `"ALE/Pong-v5"`): as it is. One registered in this process by a
  module of the caller's (`import webcrawl; train("WebCrawl-v0")`) becomes `module:WebCrawl-v0`,
  `module` being the module of the registration's entry point or the first of its packages listed
  in `env_modules` or A3C_ENV_MODULES (importing a module imports its packages first, which is
  where such a registration usually is);
- `"module:Name-v0"`: as it is;
- an entry point, a gymnasium.Env subclass or a function that makes an environment, defined at the
  top level of an importable module: `module:Name` (a3c_http/envs/make.py registers `Name` on
  every host), `module` the first of its packages that exports it under that name;
- a module (or its name) whose import registers one environment: `module:Id`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import site
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from a3c_http.envs.make import (
    FAMILIES,
    MissingDependency,
    listed_modules,
    register_family,
    unknown_env,
)

# The packages whose environments every host registers by itself (gymnasium's own, the families
# of a3c_http/envs/make.py): their ids travel as they are.
KNOWN_PACKAGES = ("gymnasium", "ale_py", "minatar", "a3c_http", "shimmy")

EnvLike = str | types.ModuleType | type | Callable[..., Any]


class EnvChoiceError(ValueError):
    """`env` names nothing that the cluster could make; `str()` says why in one line."""


@dataclass(frozen=True)
class EnvChoice:
    env_id: str  # what POST /train gets
    modules: tuple[str, ...]  # the modules A3C_ENV_MODULES must list, on every host
    paths: tuple[str, ...]  # the folders here from which they import (none for installed ones)


def resolve(env: EnvLike, env_modules: Iterable[str] = (), strict: bool = True) -> EnvChoice:
    """`env` as the cluster makes it (the module's docstring). `strict`: an id this process does
    not know is an error (else it goes as it is: a remote master may know it)."""
    modules = [m.strip() for m in env_modules if m.strip()]
    if isinstance(env, types.ModuleType):
        env_id = _registered_by(env.__name__)
    elif isinstance(env, str):
        env_id = _from_string(env.strip(), modules, strict)
    elif callable(env):
        env_id = _entry_point(env, modules)
    else:
        raise EnvChoiceError(
            f"env: expected a gymnasium id, 'module:Name-v0', an Env class, a function or a "
            f"module, not {type(env).__name__}"
        )
    module = env_id.rpartition(":")[0]
    needed = tuple(dict.fromkeys([*([module] if module else []), *modules]))
    paths = tuple(dict.fromkeys(p for p in map(import_root, needed) if p is not None))
    return EnvChoice(env_id, needed, paths)


def _from_string(env: str, modules: list[str], strict: bool) -> str:
    if not env:
        raise EnvChoiceError("env: empty")
    if ":" in env:
        return env
    try:
        register_family(env)
    except MissingDependency as exc:
        if strict:
            raise EnvChoiceError(str(exc)) from None
        return env
    if env in gym.registry:
        return _as_sent(env, gym.spec(env).entry_point, modules)
    if "/" not in env and "-v" not in env and _importable(env):
        return _registered_by(env)
    if strict:
        raise EnvChoiceError(unknown_env(env))
    return env


def _as_sent(env_id: str, entry_point: Any, modules: list[str]) -> str:
    """A registered id as the workers can make it: as it is when every host registers it, else
    prefixed with the module that registers it here."""
    namespace = env_id.rpartition("/")[0]
    module = _module_of(entry_point)
    if namespace in FAMILIES or not module or module.partition(".")[0] in KNOWN_PACKAGES:
        return env_id
    return f"{_preferred(module, modules)}:{env_id}"


def _module_of(entry_point: Any) -> str:
    if isinstance(entry_point, str):
        return entry_point.partition(":")[0]
    return getattr(entry_point, "__module__", "") or ""


def _packages(module: str) -> list[str]:
    """`a.b.c` -> `a`, `a.b`, `a.b.c`: what importing `module` imports, outermost first."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _allowed(modules: list[str]) -> list[str]:
    """The modules the caller names, then those of A3C_ENV_MODULES here."""
    return [*modules, *listed_modules()]


def _preferred(module: str, modules: list[str]) -> str:
    """The first package of `module` that the caller (or A3C_ENV_MODULES) allows, else
    `module`."""
    return next((p for p in _packages(module) if p in _allowed(modules)), module)


def _entry_point(env: Callable[..., Any], modules: list[str]) -> str:
    module, name = getattr(env, "__module__", None), getattr(env, "__qualname__", "")
    if inspect.isclass(env) and not issubclass(env, gym.Env):
        raise EnvChoiceError(f"env: {name} is a class but not a gymnasium.Env")
    if not module or module == "__main__":
        raise EnvChoiceError(
            f"env: {name or env!r} is defined in the script that runs (__main__), which the "
            "workers cannot import: move it into a module of its own (e.g. my_envs.py) and "
            "import it from there"
        )
    if not name.isidentifier():  # "<locals>", a method ("A.make"), a lambda
        raise EnvChoiceError(
            f"env: {module}.{name} is not defined at the top level of its module, so the workers "
            "cannot import it by name"
        )
    # The packages that export it under its name, outermost first (what A3C_ENV_MODULES most
    # likely lists); one the caller allows first.
    exporting = [
        p for p in _packages(module) if getattr(importlib.import_module(p), name, None) is env
    ] or [module]
    allowed = _allowed(modules)
    return f"{next((p for p in exporting if p in allowed), exporting[0])}:{name}"


def _registered_by(module: str) -> str:
    """`module:Id` for the one environment whose entry point lives in `module` (or below it),
    after importing it."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise EnvChoiceError(f"env: cannot import {module!r}: {exc}") from None
    ids = [
        env_id
        for env_id, spec in gym.registry.items()
        if (own := _module_of(spec.entry_point)) == module or own.startswith(module + ".")
    ]
    if len(ids) == 1:
        return f"{module}:{ids[0]}"
    if not ids:
        raise EnvChoiceError(
            f"env: importing {module!r} registered no environment of its own: register one "
            "(gymnasium.register) or pass the Env class"
        )
    shown = ", ".join(repr(f"{module}:{i}") for i in sorted(ids)[:5])
    raise EnvChoiceError(f"env: {module!r} registers {len(ids)} environments: name one ({shown})")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def import_root(module: str) -> str | None:
    """The folder on sys.path from which `module` imports here (`.../examples/webcrawl` for
    `webcrawl`), or None: not importable here, or from an installed package (site-packages,
    which every process of this Python has)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin not in (None, "namespace") and spec.has_location:
        path = Path(spec.origin).resolve()
        if path.name.startswith("__init__."):
            path = path.parent
    elif spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))).resolve()
    else:
        return None  # built in, frozen
    root = path.parents[len(module.split(".")) - 1]
    installed = [*site.getsitepackages(), site.getusersitepackages()]
    if any(root == Path(p).resolve() for p in installed):
        return None
    return str(root)
