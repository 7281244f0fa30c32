"""DQN's defaults and per-task presets, and the inputs and games they share with Ape-X's
(a3c_http/algos/apex/presets.py).

They are the RL Zoo's DQN hyperparameters (rl-baselines3-zoo hyperparams/dqn.yml) spread
over the default cluster of two workers: the Zoo's `train_freq` env steps and `gradient_steps` per
update become each worker's rollout (t_max x num_envs) and its gradient pushes after it, half of
each, so that the cluster makes as many gradient steps per env step as the Zoo; its env-step
counts (learning_starts, the exploration's share of n_timesteps) are halved for each worker's
own; its target_update_interval becomes versions (the cluster's gradient steps).
"""

from __future__ import annotations

from typing import Any

# Atari from pixels as the Zoo's DQN sees it (its AtariWrapper): the Nature CNN over 4 stacked
# 84x84 frames, rewards clipped and a lost life an episode end for the loss.
ATARI_INPUT: dict[str, Any] = {
    "preprocess": "atari",
    "frame_stack": 4,
    "encoder": "nature_cnn",
    "hidden_sizes": [],
    "clip_reward": True,
    "life_loss": True,
}
MINATAR_GAMES = [
    f"MinAtar/{game}-v{version}"
    for game in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
    for version in (0, 1)
]
# The MinAtar paper's network (one 16-filter 3x3 convolution, 128 units) over 4 stacked frames.
MINATAR_INPUT: dict[str, Any] = {"encoder": "small_cnn", "frame_stack": 4, "hidden_sizes": []}

# SB3's DQN defaults (Adam, lr 1e-4, batches of 32, a gradient step every 4 env steps, gradients
# clipped to 10) with the exploration and target settings of this module's docstring. A worker
# waits for each push's reply, so that its next gradient is taken on the weights its last one
# made, as SB3's steps follow each other: with pushes in flight (16, A3C's default) CartPole was
# solved in 1 seed of 3 by 100k env steps, without in 3 of 3 (docs/performance.md).
DEFAULTS: dict[str, Any] = {
    "max_in_flight": 0,
    "optimizer": "adam",
    "lr": 1e-4,
    "num_envs": 1,
    "t_max": 4,
    "gradient_steps": 1,
    "batch_size": 32,
    "max_grad_norm": 10.0,
    "target_update": 2500,
    # Judged as a3c-evaluate plays a Q-network, greedily: on evaluations, not on the
    # epsilon-greedy training episodes (which fall short of the policy).
    "solved_on": "eval",
    "eval_every_updates": 1000,
}
# Ape-X: one rollout of 50 steps a batch (the paper's actors send every 50 steps), dueling double
# 3-step DQN, gradients clipped to 40; rollouts are never too old to learn from.

# The Zoo's classic-control DQN settings: 256x256 ReLU layers. These tasks are judged as the Zoo
# scores DQN, on greedy episodes (`solved_on: "eval"`): the epsilon-greedy training episodes fall
# short of the policy (SB3's DQN with the Zoo's CartPole settings is at a training mean of 71
# after 200k env steps). CartPole on 10 of them about every 2,000 env steps; the others on 100
# about every 20,000 (gymnasium's 100 episodes: 10 judged a LunarLander policy of 147 +- 91 over
# 100 at 216).
ZOO_CLASSIC = {"hidden_sizes": [256, 256], "gamma": 0.99, "solved_on": "eval"}
HUNDRED = {"eval_episodes": 100}
DQN_PRESETS: dict[str, dict[str, Any]] = {
    # Zoo: lr 2.3e-3, batch 64, buffer 100k, learning_starts 1000, train_freq 256 with 128
    # gradient steps, target every 10 env steps (every training phase), exploration 0.16 of
    # 50k down to 0.04.
    "CartPole-v1": {
        **ZOO_CLASSIC,
        "lr": 2.3e-3,
        "batch_size": 64,
        "buffer_size": 50_000,
        "learning_starts": 500,
        "t_max": 128,
        "gradient_steps": 64,
        "target_update": 128,
        "exploration_steps": 4_000,
        "exploration_final_eps": 0.04,
        "eval_every_updates": 1000,
        "max_steps": 100_000,
    },
    # Zoo (both): lr 6.3e-4, batch 128, buffer 50k, learning_starts 0, a gradient step every env
    # step, target every 250, exploration 0.12 of 100k down to 0.1.
    **{
        env_id: {
            **ZOO_CLASSIC,
            "lr": 6.3e-4,
            "batch_size": 128,
            "buffer_size": 25_000,
            "learning_starts": 0,
            "t_max": 8,
            "gradient_steps": 8,
            "target_update": 250,
            "exploration_steps": 6_000,
            "exploration_final_eps": 0.1,
            **HUNDRED,
            "eval_every_updates": 20_000,
            "max_steps": max_steps,
        }
        for env_id, max_steps in (("Acrobot-v1", 200_000), ("LunarLander-v3", 1_000_000))
    },
    # The MinAtar paper's DQN (replay 100k, target every 1,000 updates, batches of 32, epsilon
    # 1 to 0.1 over 100k frames, learning from 5,000) with Adam and a gradient step every 4 env
    # steps instead of every one.
    **{
        env_id: {
            **MINATAR_INPUT,
            "lr": 2.5e-4,
            "buffer_size": 50_000,
            "learning_starts": 2_500,
            "target_update": 1000,
            "exploration_steps": 50_000,
            "exploration_final_eps": 0.1,
            "max_steps": 5_000_000,
        }
        for env_id in MINATAR_GAMES
    },
    # Zoo's atari: buffer 100k, learning_starts 100k, target every 1,000 env steps (250 gradient
    # steps), exploration 0.1 of 10M down to 0.01.
    **{
        env_id: {
            **ATARI_INPUT,
            "buffer_size": 50_000,
            "learning_starts": 50_000,
            "target_update": 250,
            "exploration_steps": 500_000,
            "exploration_final_eps": 0.01,
            "max_steps": 10_000_000,
            **extra,
        }
        for env_id, extra in (("ALE/Pong-v5", {"target_return": 18.0}), ("ALE/Breakout-v5", {}))
    },
}
DQN_PRESETS["ALE/*"] = DQN_PRESETS["ALE/Breakout-v5"]
