"""SAC's defaults and per-task presets: the RL Zoo's (rl-baselines3-zoo, hyperparams/sac.yml) with
SB3's defaults under them, a gradient step an env step (each worker's rollout of t_max x num_envs
steps brings as many steps of the learner)."""

from __future__ import annotations

from typing import Any

# SB3's SAC: Adam at 3e-4, 256x256 ReLU layers, batches of 256, a replay of 1M, tau 0.005, the
# entropy coefficient learned (from 1.0, towards an entropy of -action dims); evaluated on the
# deterministic policy, as the Zoo scores SAC.
DEFAULTS: dict[str, Any] = {
    "optimizer": "adam",
    "lr": 3e-4,
    "hidden_sizes": [256, 256],
    "num_envs": 1,
    "t_max": 16,
    "queue_size": 1,
    "gradient_steps": 16,
    "max_policy_lag": 1_000_000_000,
    "max_in_flight": 1,
    # Its actors' work is light (an MLP's step and the environment's): the learner takes every
    # core of the master host (at most 4).
    "learner_threads": 4,
    "solved_on": "eval",
    "eval_every_updates": 250,
}

# LunarLanderContinuous: gymnasium's LunarLander-v3 with continuous actions (the Zoo's
# LunarLanderContinuous-v3); BipedalWalker-v3 without the Zoo's gSDE, which this cluster lacks.
MUJOCO = {"learning_starts": 10_000, "max_steps": 1_000_000}
SAC_PRESETS: dict[str, dict[str, Any]] = {
    "Pendulum-v1": {"lr": 1e-3, "max_steps": 20_000, "eval_every_updates": 50},
    "LunarLander-v3": {
        "env_kwargs": {"continuous": True},
        "lr": 7.3e-4,
        "lr_schedule": "linear",
        "tau": 0.01,
        "learning_starts": 10_000,
        "hidden_sizes": [400, 300],
        "max_steps": 500_000,
        "eval_episodes": 100,
        "eval_every_updates": 1250,
    },
    "BipedalWalker-v3": {
        "lr": 7.3e-4,
        "buffer_size": 300_000,
        "gamma": 0.98,
        "tau": 0.02,
        "learning_starts": 10_000,
        "hidden_sizes": [400, 300],
        "max_steps": 500_000,
        "eval_every_updates": 1250,
    },
    **{
        env_id: {**MUJOCO, "eval_every_updates": 1250}
        for env_id in ("Hopper-v5", "HalfCheetah-v5", "Walker2d-v5")
    },
}
