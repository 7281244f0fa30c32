"""Ape-X DPG's defaults and per-task presets: the Ape-X paper's n-step prioritized replay with the
RL Zoo's TD3 settings (rl-baselines3-zoo, hyperparams/td3.yml) under them, a gradient step an env
step."""

from __future__ import annotations

from typing import Any

# Ape-X DPG: 5-step returns, a replay prioritized with alpha 0.6 and beta 0.4 (the paper's);
# 256x256 ReLU layers, Adam at 1e-3 and batches of 256 (TD3's), the targets moved by 0.005 a step.
DEFAULTS: dict[str, Any] = {
    "optimizer": "adam",
    "lr": 1e-3,
    "hidden_sizes": [256, 256],
    "num_envs": 1,
    "t_max": 16,
    "queue_size": 1,
    "gradient_steps": 16,
    "n_step": 5,
    "prioritized_alpha": 0.6,
    "max_policy_lag": 1_000_000_000,
    "max_in_flight": 1,
    # Its actors' work is light (an MLP's step and the environment's): the learner takes every
    # core of the master host (at most 4).
    "learner_threads": 4,
    "solved_on": "eval",
    "eval_every_updates": 250,
}

# TD3 (the Zoo's): twin critics, the actor and the targets every second step, target actions
# smoothed by noise of 0.2 clipped at 0.5; 400x300 layers; the Zoo's 10,000 random steps before
# learning are the actors' own noise here, from the first step.
TD3 = {
    "twin_critics": True,
    "policy_delay": 2,
    "target_noise": 0.2,
    "hidden_sizes": [400, 300],
    "gamma": 0.98,
    "buffer_size": 200_000,
}
MUJOCO = {
    "twin_critics": True,
    "policy_delay": 2,
    "target_noise": 0.2,
    "learning_starts": 10_000,
    "max_steps": 1_000_000,
    "eval_every_updates": 1250,
}
APEX_DPG_PRESETS: dict[str, dict[str, Any]] = {
    # One-step returns: the 5-step ones of the default reached -200 in a median of 9,378 env steps
    # over seeds 0 to 2 (2,723 to 11,814), one-step ones in 4,411 (3,471 to 7,563); docs/
    # performance.md "SAC and Ape-X DPG".
    "Pendulum-v1": {"n_step": 1, "max_steps": 20_000, "eval_every_updates": 50},
    "LunarLander-v3": {
        **TD3,
        "env_kwargs": {"continuous": True},
        "learning_starts": 10_000,
        "max_steps": 300_000,
        "eval_episodes": 100,
        "eval_every_updates": 1250,
    },
    "BipedalWalker-v3": {
        **TD3,
        "learning_starts": 10_000,
        "max_steps": 1_000_000,
        "eval_every_updates": 1250,
    },
    **{env_id: MUJOCO for env_id in ("Hopper-v5", "HalfCheetah-v5", "Walker2d-v5")},
}
