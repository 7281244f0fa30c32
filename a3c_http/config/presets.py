"""Per-task presets, as the RL Zoo keeps them: the settings that solve each task with the default
cluster (a master and 2 workers), measured by `scripts/bench.py learn`.

`POST /train {"env_id": "Acrobot-v1"}` takes that environment's preset for every field the body
does not give; the resolved config (and the preset's name, in its `preset` field) is what /status
and config.json show. CartPole-v1's preset is the default config itself. An environment without
a preset of its own takes its family's, where it has one (`ALE/*`: every Atari game).
"""

from __future__ import annotations

from typing import Any

from a3c_http.config.value_presets import APEX_DEFAULTS, APEX_PRESETS, DQN_DEFAULTS, DQN_PRESETS

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


# Where each algorithm starts before a task's preset: A3C from TrainConfig's defaults (SB3's A2C);
# PPO from SB3's PPO defaults, its 2048 steps an update as 2 workers x 4 environments x 256 steps;
# IMPALA from the IMPALA paper's (Espeholt et al. 2018) unrolls of 20 steps, RMSprop, an entropy
# bonus of 0.01, one step a batch of rollouts.
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "a3c": {},
    "ppo": {
        "optimizer": "adam",
        "lr": 3e-4,
        "num_envs": 4,
        "t_max": 256,
        "queue_size": 2,
        "batch_size": 64,
        "n_epochs": 10,
        "gae_lambda": 0.95,
        "max_policy_lag": 2,
        # The seed's DPPO: a worker waits for each reply, so it acts with weights at most one
        # version old.
        "max_in_flight": 0,
    },
    "impala": {
        "lr": 6e-4,
        "n_epochs": 1,
        "t_max": 20,
        "num_envs": 8,
        "queue_size": 2,
        "entropy_coef": 0.01,
        "max_policy_lag": 16,
    },
    # dqn and apex: a3c_http/config/value_presets.py.
    "dqn": DQN_DEFAULTS,
    "apex": APEX_DEFAULTS,
}

# PPO: the RL Zoo's hyperparameters (rl-baselines3-zoo hyperparams/ppo.yml) for the tasks A3C
# has presets for; the Zoo's n_envs x n_steps is queue_size (2: one rollout of each of 2
# workers) x num_envs x t_max, its n_timesteps max_steps (the horizon of its linear schedules).
PPO_ATARI: dict[str, Any] = {
    **ATARI,
    "optimizer": "adam",
    "num_envs": 4,
    "t_max": 128,
    "n_epochs": 4,
    "batch_size": 256,
    "lr": 2.5e-4,
    "clip_range": 0.1,
    "clip_range_schedule": "linear",
    "value_coef": 0.5,
}
PPO_PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {
        "num_envs": 4,
        "t_max": 32,
        "batch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "lr": 1e-3,
        "lr_schedule": "linear",
        "clip_range_schedule": "linear",
        "max_steps": 100_000,
        # Its updates take longer than a worker's rollout of 128 steps: with one push in flight
        # the workers go on acting meanwhile, for the wall time (docs/performance.md).
        "max_in_flight": 1,
    },
    "Acrobot-v1": {
        "normalize_obs": True,
        "normalize_reward": True,
        "num_envs": 8,
        "t_max": 256,
        "gae_lambda": 0.94,
        "n_epochs": 4,
        "max_steps": 1_000_000,
    },
    # The Zoo's Pendulum settings without gSDE (plain Gaussian exploration instead).
    "Pendulum-v1": {
        "normalize_obs": True,
        "normalize_reward": True,
        "num_envs": 2,
        "t_max": 1024,
        "gae_lambda": 0.95,
        "gamma": 0.9,
        "lr": 1e-3,
        "target_return": -200.0,
        "max_steps": 1_000_000,
    },
    # SB3's PPO defaults (gamma 0.99, GAE 0.95, no entropy bonus, 10 epochs of 64) with both
    # normalisations, a quarter of the Zoo's 16,384 steps an update, and the learning rate and clip
    # range falling linearly. The Zoo's gamma 0.999, GAE 0.98 and entropy 0.01 left the lander
    # hovering below 200 in some seeds (135 after 1,000,000 env steps with the Zoo's settings as
    # they are); these solved every seed tried (docs/performance.md "PPO and IMPALA").
    "LunarLander-v3": {
        "normalize_obs": True,
        "normalize_reward": True,
        "num_envs": 8,
        "t_max": 256,
        "lr_schedule": "linear",
        "clip_range_schedule": "linear",
        "max_steps": 1_000_000,
    },
    "a3c_http/CueMemory-v0": {"core": "lstm", "t_max": 16, "num_envs": 16, "batch_size": 256},
    # MinAtar: the Zoo's Atari settings on the MinAtar paper's small CNN.
    **{
        f"MinAtar/{game}-v{version}": {
            **{k: v for k, v in PPO_ATARI.items() if k not in ATARI or k == "num_envs"},
            "encoder": "small_cnn",
            "frame_stack": 4,
            "wire_dtype": "bfloat16",
            "entropy_coef": 0.01,
            "max_steps": 5_000_000,
        }
        for game in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
        for version in (0, 1)
    },
    "ALE/Pong-v5": {**PPO_ATARI, "target_return": 18.0},
    "ALE/Breakout-v5": PPO_ATARI,
}

# IMPALA: the paper's settings scaled to the small tasks, and A3C's MinAtar and Atari networks.
IMPALA_PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"num_envs": 8, "t_max": 16, "entropy_coef": 0.0, "lr": 1e-3},
    **{
        f"MinAtar/{game}-v{version}": {
            # MinAtar's own observation, as the MinAtar paper's agents see it (its channels
            # carry the motion, e.g. Breakout's trail): a stack of 4 made rollouts 4 times the
            # bytes and the convolution 4 times the work, and the cluster 1.5 times slower.
            "encoder": "small_cnn",
            "frame_stack": 1,
            # An update from each worker's rollout of 32 environments x 5 steps (160): twice
            # the updates of the 320 steps before learned more (docs/performance.md).
            "num_envs": 32,
            "t_max": 5,
            "queue_size": 1,
            # Traces decayed as TD(lambda)'s: 0.8 and 0.9 learned more than the paper's 1.
            "vtrace_lambda": 0.8,
            "lr": 1e-3,
            "wire_dtype": "bfloat16",
            "value_coef": 0.25,
            "max_steps": 5_000_000,
        }
        for game in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
        for version in (0, 1)
    },
    "ALE/Pong-v5": {**ATARI, "t_max": 20, "target_return": 18.0},
    "ALE/Breakout-v5": {**ATARI, "t_max": 20},
}

# Each algorithm's presets, by task.
ALGORITHM_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "a3c": PRESETS,
    "ppo": PPO_PRESETS,
    "impala": IMPALA_PRESETS,
    "dqn": DQN_PRESETS,
    "apex": APEX_PRESETS,
}

# The presets of whole families of environments, for an env_id without one of its own: every
# Atari game of ale-py takes the Atari settings. name -> (env_id prefix, settings).
FAMILY_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {"ALE/*": ("ALE/", ATARI)}


def _algorithm(data: Any) -> str:
    algo = data.get("algo", "a3c") if isinstance(data, dict) else "a3c"
    # An unknown algo (or not a string at all) gets its own 422 from the field.
    return algo if isinstance(algo, str) and algo in ALGORITHM_PRESETS else "a3c"


def preset_of(env_id: Any, algo: str = "a3c") -> str | None:
    """The name of `env_id`'s preset for `algo`: its own, else its family's, else None."""
    if not isinstance(env_id, str):
        return None  # a bad env_id: its own 422
    if env_id in ALGORITHM_PRESETS.get(algo, PRESETS):
        return env_id
    return next((name for name, (prefix, _) in FAMILY_PRESETS.items()
                 if env_id.startswith(prefix) and preset_values(name, algo) is not None), None)


def preset_values(name: str, algo: str = "a3c") -> dict[str, Any] | None:
    """The values of `algo`'s preset called `name`, or None for no such preset. A family's
    preset for another algorithm than A3C is that algorithm's preset of the family's game
    (`ALE/*`: `ALE/Breakout-v5`'s)."""
    presets = ALGORITHM_PRESETS.get(algo, PRESETS)
    if name in presets:
        return presets[name]
    family = FAMILY_PRESETS.get(name)
    if family is None:
        return None
    return family[1] if algo == "a3c" else presets.get(f"{family[0]}Breakout-v5")


def with_preset(data: Any) -> Any:
    """The raw body of a config with its algorithm's defaults (`ALGORITHM_DEFAULTS`) and its
    preset's values under the fields it does not give. `"preset": null` asks for none;
    `"preset": "Acrobot-v1"` for a named one (of the body's `algo`); absent: the preset of
    `env_id`, if there is one."""
    if not isinstance(data, dict):
        return data
    algo = _algorithm(data)
    defaults = ALGORITHM_DEFAULTS[algo]
    name = data.get("preset", preset_of(data.get("env_id", "CartPole-v1"), algo))
    if name is None:
        return {**defaults, **data}
    values = preset_values(name, algo) if isinstance(name, str) else None
    if values is None:
        known = ", ".join([*ALGORITHM_PRESETS[algo], *FAMILY_PRESETS])
        raise ValueError(
            f"preset: unknown preset {name!r} for algo {algo!r}; known: {known} (null for none)"
        )
    return {**defaults, **values, **data, "preset": name}
