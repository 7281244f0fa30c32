"""How a config takes its algorithm's defaults and a task's preset: the mechanism, shared by every
algorithm, whose values each algorithm's room keeps (a3c_http/algos/<algo>/presets.py, named by
its config section's `defaults` and `presets`).

`POST /train {"env_id": "Acrobot-v1"}` takes that environment's preset for every field the body
does not give; the resolved config (and the preset's name, in its `preset` field) is what /status
and config.json show. An environment without a preset of its own takes its family's, where the
algorithm has one (`ALE/*`: every Atari game).
"""

from __future__ import annotations

from typing import Any

# The families of environments a preset may stand for: name -> the env_id prefix it matches.
FAMILIES: dict[str, str] = {"ALE/*": "ALE/"}


def preset_of(env_id: Any, presets: dict[str, dict[str, Any]]) -> str | None:
    """The name of `env_id`'s preset among `presets`: its own, else its family's, else None."""
    if not isinstance(env_id, str):
        return None  # a bad env_id: its own 422
    if env_id in presets and env_id not in FAMILIES:
        return env_id
    return next((name for name, prefix in FAMILIES.items()
                 if env_id.startswith(prefix) and name in presets), None)


def with_preset(
    data: Any, defaults: dict[str, Any], presets: dict[str, dict[str, Any]]
) -> Any:
    """The raw body of a config with its algorithm's `defaults` and its preset's values under the
    fields it does not give. `"preset": null` asks for none; `"preset": "Acrobot-v1"` for a named
    one (of the body's algorithm); absent: the preset of `env_id`, if there is one."""
    if not isinstance(data, dict):
        return data
    name = data.get("preset", preset_of(data.get("env_id", "CartPole-v1"), presets))
    if name is None:
        return {**defaults, **data}
    values = presets.get(name) if isinstance(name, str) else None
    if values is None:
        known = ", ".join(presets)
        raise ValueError(
            f"preset: unknown preset {name!r} for algo {data.get('algo', 'a3c')!r}; known: "
            f"{known} (null for none)"
        )
    return {**defaults, **values, **data, "preset": name}
