"""Per-task presets, as the RL Zoo keeps them: the settings that solve each task with the default
cluster (a master and 2 workers), measured by `scripts/bench.py learn`.

`POST /train {"env_id": "Acrobot-v1"}` takes that environment's preset for every field the body
does not give; the resolved config (and the preset's name, in its `preset` field) is what /status
and config.json show. CartPole-v1's preset is the default config itself. An environment without
a preset of its own takes its family's, where it has one (`ALE/*`: every Atari game).
"""

from __future__ import annotations

from typing import Any

# Atari from pixels (the atari extra) with the A3C paper's settings: 84x84 grayscale frames,
# 4 stacked, the Nature CNN, t_max 5, RMSprop with a linearly decayed learning rate, entropy
# 0.01; rewards clipped and a lost life an episode end, both for the loss only. 16 environments a
# worker (the Zoo's A2C: 80 env steps an update) and bfloat16 on the wire, so that one master
# keeps up with about 15 workers (docs/guide/training.md, "Pixels and memory").
ATARI: dict[str, Any] = {
    "preprocess": "atari",
    "frame_stack": 4,
    "encoder": "nature_cnn",
    "hidden_sizes": [],
    "num_envs": 16,
    "wire_dtype": "bfloat16",
    "clip_reward": True,
    "life_loss": True,
    "entropy_coef": 0.01,
    "value_coef": 0.25,
    "lr_schedule": "linear",
    "max_steps": 10_000_000,
}

# Each preset lists only what differs from TrainConfig's defaults (SB3's A2C settings).
PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {},
    # RL Zoo: normalize, 16 envs (2 workers x 8 here), no entropy bonus.
    "Acrobot-v1": {"normalize_obs": True, "normalize_reward": True},
    # RL Zoo's tuned Pendulum settings without gSDE (plain Gaussian exploration instead):
    # a short horizon (gamma 0.9, GAE 0.9), 8-step rollouts, both normalisations.
    "Pendulum-v1": {
        "normalize_obs": True,
        "normalize_reward": True,
        "t_max": 8,
        "gamma": 0.9,
        "gae_lambda": 0.9,
        "value_coef": 0.4,
        "target_return": -250.0,
        "max_steps": 3_000_000,
    },
    # The RL Zoo's gamma 0.995 with both normalisations (its A2C learning rate and entropy bonus
    # learned far slower here).
    "LunarLander-v3": {
        "gamma": 0.995,
        "normalize_obs": True,
        "normalize_reward": True,
        "max_steps": 3_000_000,
    },
    # The memory task of a3c_http/envs/tasks.py: an LSTM, and rollouts longer than its episodes so
    # that most of them hold the cue and its question together.
    "a3c_http/CueMemory-v0": {"core": "lstm", "t_max": 16},
    # MinAtar (the minatar extra): the MinAtar paper's small CNN with the RL Zoo's Atari A2C
    # settings (entropy 0.01, value 0.25); 16 environments a worker and bfloat16 on the wire, both
    # faster for as much learning (docs/guide/training.md, "Pixels and memory").
    **{
        f"MinAtar/{game}-v{version}": {
            "encoder": "small_cnn",
            "frame_stack": 4,
            "num_envs": 16,
            "wire_dtype": "bfloat16",
            "entropy_coef": 0.01,
            "value_coef": 0.25,
            "max_steps": 5_000_000,
        }
        for game in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
        for version in (0, 1)
    },
    # Pong's own target (universe-starter-agent and the A3C paper's figure); Breakout's is the
    # family's (none).
    "ALE/Pong-v5": {**ATARI, "target_return": 18.0},
    "ALE/Breakout-v5": ATARI,
}


# The presets of whole families of environments, for an env_id without one of its own: every
# Atari game of ale-py takes the Atari settings. name -> (env_id prefix, settings).
FAMILY_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {"ALE/*": ("ALE/", ATARI)}


def preset_of(env_id: Any) -> str | None:
    """The name of `env_id`'s preset: its own, else its family's, else None."""
    if not isinstance(env_id, str):
        return None  # a bad env_id: its own 422
    if env_id in PRESETS:
        return env_id
    return next((name for name, (prefix, _) in FAMILY_PRESETS.items()
                 if env_id.startswith(prefix)), None)


def preset_values(name: str) -> dict[str, Any] | None:
    """The values of the preset called `name`, or None for no such preset."""
    if name in PRESETS:
        return PRESETS[name]
    family = FAMILY_PRESETS.get(name)
    return family[1] if family else None


def with_preset(data: Any) -> Any:
    """The raw body of a config with its preset's values under the fields it does not give.
    `"preset": null` asks for none; `"preset": "Acrobot-v1"` for a named one; absent: the preset
    of `env_id`, if there is one."""
    if not isinstance(data, dict):
        return data
    name = data.get("preset", preset_of(data.get("env_id", "CartPole-v1")))
    if name is None:
        return data
    values = preset_values(name) if isinstance(name, str) else None
    if values is None:
        known = ", ".join([*PRESETS, *FAMILY_PRESETS])
        raise ValueError(f"preset: unknown preset {name!r}; known: {known} (null for none)")
    return {**values, **data, "preset": name}
