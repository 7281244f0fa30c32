"""Ape-X's defaults and per-task presets, the Ape-X paper's (Horgan et al. 2018): 3-step double
dueling DQN, a prioritized replay with alpha 0.6 and beta 0.4, the target network every 2,500
learner steps on Atari, batches of 512 there.
"""

from __future__ import annotations

from typing import Any

from a3c_http.algos.dqn.presets import (
    ATARI_INPUT,
    HUNDRED,
    MINATAR_GAMES,
    MINATAR_INPUT,
    ZOO_CLASSIC,
)

DEFAULTS: dict[str, Any] = {
    "optimizer": "adam",
    "lr": 1e-4,
    "num_envs": 1,
    "t_max": 50,
    "queue_size": 1,
    "gradient_steps": 25,
    "batch_size": 64,
    "n_step": 3,
    "dueling": True,
    "max_grad_norm": 40.0,
    "target_update": 2500,
    "max_policy_lag": 1_000_000_000,
    "max_in_flight": 1,
    # Judged as a3c-evaluate plays a Q-network, greedily: on evaluations, not on the actors'
    # epsilon-greedy episodes (dqn's defaults say why).
    "solved_on": "eval",
    "eval_every_updates": 100,
}

APEX_PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {
        **ZOO_CLASSIC,
        "lr": 1e-3,
        "num_envs": 4,
        "t_max": 32,
        "gradient_steps": 64,
        "learning_starts": 1000,
        "target_update": 100,
        "eval_every_updates": 16,
        "max_steps": 100_000,
    },
    **{
        env_id: {
            **ZOO_CLASSIC,
            "lr": 6.3e-4,
            "batch_size": 128,
            "num_envs": 4,
            "t_max": 32,
            "gradient_steps": 128,
            "learning_starts": 1000,
            "target_update": 250,
            **HUNDRED,
            "eval_every_updates": 80,
            "max_steps": max_steps,
        }
        for env_id, max_steps in (("Acrobot-v1", 200_000), ("LunarLander-v3", 1_000_000))
    },
    **{
        env_id: {
            **MINATAR_INPUT,
            # MinAtar's own observation, as the MinAtar paper's agents see it (IMPALA's preset too).
            "frame_stack": 1,
            # Falling to 0 at max_steps: with it constant, the greedy policy fell late in the run
            # in 2 seeds of 3 (docs/performance.md).
            "lr": 2.5e-4,
            "lr_schedule": "linear",
            "num_envs": 16,
            "t_max": 16,
            # The reference's batches of 32 every 4 env steps (64 of them a worker's push of 256
            # steps): batches of 128 every 16 ended lower (docs/performance.md).
            "gradient_steps": 64,
            "batch_size": 32,
            "learning_starts": 5_000,
            # The target every 1,000 env steps, as the MinAtar paper's and the reference's.
            "target_update": 250,
            "wire_dtype": "bfloat16",
            "max_steps": 5_000_000,
        }
        for env_id in MINATAR_GAMES
    },
    **{
        env_id: {
            **ATARI_INPUT,
            "lr": 0.00025 / 4,
            "batch_size": 512,
            "num_envs": 16,
            "t_max": 50,
            "gradient_steps": 4,
            # A transition keeps both of its frame stacks (2 x 28 KB): 100k of them take 5.6 GB
            # of the master host's memory (the paper's 2M were compressed).
            "buffer_size": 100_000,
            "learning_starts": 50_000,
            "wire_dtype": "bfloat16",
            "max_steps": 10_000_000,
            **extra,
        }
        for env_id, extra in (("ALE/Pong-v5", {"target_return": 18.0}), ("ALE/Breakout-v5", {}))
    },
}
APEX_PRESETS["ALE/*"] = APEX_PRESETS["ALE/Breakout-v5"]
