"""A3C's per-task presets, as the RL Zoo keeps them: the settings that solve each task with the
default cluster (a master and 2 workers), measured by `scripts/bench.py learn`. A3C starts from
the shared section's defaults (SB3's A2C's); CartPole-v1's preset is those defaults themselves.
sync A2C and best weights take the same presets.
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

# Every Atari game of ale-py without a preset of its own.
PRESETS["ALE/*"] = ATARI
