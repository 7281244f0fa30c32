"""What to tell a user who named something this project does not know: the close matches among
the names it does know, and ours for the names people bring from other RL libraries.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

# Config names of Stable-Baselines3 and the RL Zoo, CleanRL and the A3C implementations people
# port from, and ours for them. Those that are ours already (gamma, gae_lambda, max_grad_norm,
# seed, log_std_init) need no entry.
FOREIGN_FIELDS: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr",),
    "n_steps": ("t_max",),
    "num_steps": ("t_max",),
    "ent_coef": ("entropy_coef",),
    "entropy_beta": ("entropy_coef",),
    "vf_coef": ("value_coef",),
    "value_loss_coef": ("value_coef",),
    "n_envs": ("num_envs",),
    "n_timesteps": ("max_steps",),
    "total_timesteps": ("max_steps",),
    "normalize": ("normalize_obs", "normalize_reward"),
    "use_rms_prop": ("optimizer",),
    "anneal_lr": ("lr_schedule",),
    "net_arch": ("hidden_sizes",),
    "policy_kwargs": ("hidden_sizes", "shared_torso", "log_std_init"),
    "eval_freq": ("eval_every_updates",),
    "n_eval_episodes": ("eval_episodes",),
    "env": ("env_id",),
    "env_name": ("env_id",),
    "max_episode_steps": ("env_kwargs",),  # an argument of gymnasium.make
    "num_processes": ("workers",),
    "n_workers": ("workers",),
}


def close_matches(name: str, known: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The known names most like `name`, best first, ignoring case."""
    by_lower = {k.lower(): k for k in known}
    return [by_lower[m] for m in difflib.get_close_matches(name.lower(), by_lower, n, cutoff)]


def did_you_mean(names: list[str]) -> str:
    quoted = [repr(n) for n in names]
    choices = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"did you mean {choices}?"


def unknown_field(name: str, fields: Iterable[str]) -> str:
    """`unknown field 'learning_rate': did you mean 'lr'?`: ours for another library's name, else
    the fields spelled most like it."""
    fields = list(fields)
    ours = [f for f in FOREIGN_FIELDS.get(name, ()) if f in fields]
    suggestions = ours or close_matches(name, fields)
    if suggestions:
        return f"unknown field {name!r}: {did_you_mean(suggestions)}"
    return (
        f"unknown field {name!r}: the fields are those of docs/configuration.md's \"Training "
        "config\" table (and of /openapi.json)"
    )


def with_field_hints(exc: ValidationError, fields: Iterable[str]) -> ValidationError:
    """`exc` with the message of each unknown field of the model (`extra_forbidden` at its top
    level) replaced by `unknown_field`'s; its type and place stay, so every 422 still names it."""
    fields = list(fields)

    def unknown(error: Any) -> bool:
        return error["type"] == "extra_forbidden" and len(error["loc"]) == 1

    errors = exc.errors()
    if not any(unknown(e) for e in errors):
        return exc
    line_errors: list[Any] = [
        InitErrorDetails(
            type=PydanticCustomError("extra_forbidden", unknown_field(str(e["loc"][0]), fields)),
            loc=e["loc"],
            input=e["input"],
        )
        if unknown(e)
        else e
        for e in errors
    ]
    return ValidationError.from_exception_data(exc.title, line_errors)
