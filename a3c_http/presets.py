"""Per-task presets, as the RL Zoo keeps them: the settings that solve each task with the default
cluster (a master and 2 workers), measured by scripts/bench_learn.py.

`POST /train {"env_id": "Acrobot-v1"}` takes that environment's preset for every field the body
does not give; the resolved config (and the preset's name, in its `preset` field) is what /status
and config.json show. CartPole-v1's preset is the default config itself.
"""

from __future__ import annotations

from typing import Any

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
    # The RL Zoo's gamma 0.995 with both normalisations (its A2C settings, lr 8.3e-4 falling
    # linearly and a 1e-5 entropy bonus, were still at mean -54 after 1.8 million steps here).
    "LunarLander-v3": {
        "gamma": 0.995,
        "normalize_obs": True,
        "normalize_reward": True,
        "max_steps": 3_000_000,
    },
}


def with_preset(data: Any) -> Any:
    """The raw body of a config with its preset's values under the fields it does not give.
    `"preset": null` asks for none; `"preset": "Acrobot-v1"` for a named one; absent: the preset
    of `env_id`, if there is one."""
    if not isinstance(data, dict):
        return data
    env_id = data.get("env_id", "CartPole-v1")
    own = env_id if isinstance(env_id, str) and env_id in PRESETS else None  # a bad env_id: 422
    name = data.get("preset", own)
    if name is None:
        return data
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(
            f"preset: unknown preset {name!r}; known: {', '.join(PRESETS)} (null for none)"
        )
    return {**PRESETS[name], **data, "preset": name}
