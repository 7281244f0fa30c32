"""The RL Zoo's hyperparameters the references of `bench.py learn` train with (rl_zoo3 is not a
dependency: its settings are copied here)."""

# RL Zoo 2.9.2, hyperparams/a2c.yml (rl_zoo3 is not a dependency: its settings are copied here).
ZOO = {
    "CartPole-v1": {"n_timesteps": 500_000, "n_envs": 8, "ent_coef": 0.0},
    "Acrobot-v1": {"n_timesteps": 500_000, "normalize": True, "n_envs": 16, "ent_coef": 0.0},
    "Pendulum-v1": {
        "n_timesteps": 1_000_000, "normalize": True, "n_envs": 8, "ent_coef": 0.0,
        "max_grad_norm": 0.5, "n_steps": 8,
        "gae_lambda": 0.9, "vf_coef": 0.4, "gamma": 0.9, "use_rms_prop": True,
        "normalize_advantage": False, "learning_rate": "lin_7e-4", "use_sde": True,
        "policy_kwargs": {"log_std_init": -2, "ortho_init": False},
    },
    "LunarLander-v3": {
        "n_timesteps": 200_000, "n_envs": 8, "gamma": 0.995, "n_steps": 5,
        "learning_rate": "lin_0.00083", "ent_coef": 0.00001,
    },
    # The Zoo's `atari` entry (frame stack 4) without its AtariWrapper (MinAtar needs none), on
    # the MinAtar paper's network instead of NatureCNN; the budget, not the Zoo's 1e7 (its
    # learning rate is constant, so no schedule depends on it). Names stand for classes that
    # run_sb3 imports: SB3 is an optional dependency.
    "MinAtar/Breakout-v1": {
        "n_timesteps": 2_000_000, "n_envs": 16, "frame_stack": 4, "ent_coef": 0.01,
        "vf_coef": 0.25,
        "policy_kwargs": {
            "optimizer_class": "RMSpropTFLike", "optimizer_kwargs": {"eps": 1e-5},
            "features_extractor_class": "MinAtarCNN", "normalize_images": False,
        },  # SB3's own net_arch after a custom extractor: 64x64 tanh MLPs for policy and value
    },
}

# RL Zoo 2.9.2, hyperparams/ppo.yml: SB3's PPO, the reference of `--algo ppo` (and the tasks'
# budgets and targets that differ for PPO: issue 33's bar).
ZOO_PPO = {
    "CartPole-v1": {
        "n_timesteps": 100_000, "n_envs": 8, "n_steps": 32, "batch_size": 256,
        "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0,
        "learning_rate": "lin_0.001", "clip_range": "lin_0.2",
    },
    "Acrobot-v1": {
        "n_timesteps": 1_000_000, "normalize": True, "n_envs": 16, "n_steps": 256,
        "gae_lambda": 0.94, "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.0,
    },
    "Pendulum-v1": {
        "n_timesteps": 100_000, "normalize": True, "n_envs": 4, "n_steps": 1024,
        "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10, "ent_coef": 0.0,
        "learning_rate": 1e-3, "clip_range": 0.2, "use_sde": True, "sde_sample_freq": 4,
    },
    "LunarLander-v3": {
        "n_timesteps": 1_000_000, "n_envs": 16, "n_steps": 1024, "batch_size": 64,
        "gae_lambda": 0.98, "gamma": 0.999, "n_epochs": 4, "ent_coef": 0.01,
    },
    "MinAtar/Breakout-v1": {
        "n_timesteps": 2_000_000, "n_envs": 8, "frame_stack": 4, "n_steps": 128,
        "n_epochs": 4, "batch_size": 256, "learning_rate": "lin_2.5e-4",
        "clip_range": "lin_0.1", "vf_coef": 0.5, "ent_coef": 0.01,
        "policy_kwargs": {"features_extractor_class": "MinAtarCNN", "normalize_images": False},
    },
}

# RL Zoo 2.9.2, hyperparams/ppo_lstm.yml: SB3-contrib's RecurrentPPO, the reference of `--algo
# ppo` on a task that needs memory (the Zoo's CartPoleNoVel-v1 is this project's
# a3c_http/CartPoleNoVel-v1).
ZOO_PPO_LSTM = {
    "a3c_http/CartPoleNoVel-v1": {
        "n_timesteps": 100_000, "normalize": True, "n_envs": 8, "n_steps": 32,
        "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0,
        "learning_rate": "lin_0.001", "clip_range": "lin_0.2",
        "policy_kwargs": {"ortho_init": False, "activation_fn": "ReLU", "lstm_hidden_size": 64,
                          "enable_critic_lstm": True, "net_arch": {"pi": [64], "vf": [64]}},
    },
}

# RL Zoo 2.9.2, hyperparams/dqn.yml: SB3's DQN, the reference of `--algo dqn` and `--algo apex`.
_ZOO_DQN_CLASSIC = {
    "n_timesteps": 100_000, "learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50_000,
    "learning_starts": 0, "gamma": 0.99, "target_update_interval": 250, "train_freq": 4,
    "gradient_steps": -1, "exploration_fraction": 0.12, "exploration_final_eps": 0.1,
    "policy_kwargs": {"net_arch": [256, 256]},
}
ZOO_DQN = {
    "CartPole-v1": {
        "n_timesteps": 50_000, "learning_rate": 2.3e-3, "batch_size": 64,
        "buffer_size": 100_000, "learning_starts": 1000, "gamma": 0.99,
        "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
        "exploration_fraction": 0.16, "exploration_final_eps": 0.04,
        "policy_kwargs": {"net_arch": [256, 256]},
    },
    "Acrobot-v1": _ZOO_DQN_CLASSIC,
    "LunarLander-v3": _ZOO_DQN_CLASSIC,
    # Not in the Zoo: the MinAtar paper's DQN (replay 100k, learning from 5,000, batches of 32,
    # target every 1,000, epsilon 1 to 0.1 over the first 100k frames) on its network, with the
    # Zoo's Atari gradient step every 4 env steps (its every step would take SB3 hours here).
    "MinAtar/Breakout-v1": {
        "n_timesteps": 2_000_000, "frame_stack": 4, "learning_rate": 2.5e-4, "batch_size": 32,
        "buffer_size": 100_000, "learning_starts": 5_000, "target_update_interval": 1000,
        "train_freq": 4, "gradient_steps": 1, "exploration_fraction": 0.05,
        "exploration_final_eps": 0.1,
        "policy_kwargs": {"features_extractor_class": "MinAtarCNN", "normalize_images": False},
    },
}

# RL Zoo (rl-baselines3-zoo at 22e3ff2), hyperparams/sac.yml and td3.yml: SB3's SAC and TD3, the
# references of `--algo sac` and `--algo apex_dpg`. LunarLander-v3 with `continuous` is the Zoo's
# LunarLanderContinuous-v3; BipedalWalker's gSDE and log_std_init are left out on both sides (the
# cluster has no gSDE). Names of noise types stand for classes run_sb3_offpolicy builds.
_MUJOCO = {"n_timesteps": 1_000_000, "learning_starts": 10_000}
ZOO_SAC = {
    "Pendulum-v1": {"n_timesteps": 20_000, "learning_rate": 1e-3},
    "LunarLander-v3": {
        "n_timesteps": 500_000, "env_kwargs": {"continuous": True}, "batch_size": 256,
        "learning_rate": "lin_7.3e-4", "buffer_size": 1_000_000, "ent_coef": "auto",
        "gamma": 0.99, "tau": 0.01, "train_freq": 1, "gradient_steps": 1,
        "learning_starts": 10_000, "policy_kwargs": {"net_arch": [400, 300]},
    },
    "BipedalWalker-v3": {
        "n_timesteps": 500_000, "learning_rate": 7.3e-4, "buffer_size": 300_000,
        "batch_size": 256, "ent_coef": "auto", "gamma": 0.98, "tau": 0.02, "train_freq": 64,
        "gradient_steps": 64, "learning_starts": 10_000,
        "policy_kwargs": {"net_arch": [400, 300]},
    },
    "Hopper-v5": _MUJOCO,
    "HalfCheetah-v5": _MUJOCO,
    "Walker2d-v5": _MUJOCO,
}
_TD3_CLASSIC = {
    "gamma": 0.98, "buffer_size": 200_000, "learning_starts": 10_000, "noise_type": "normal",
    "noise_std": 0.1, "gradient_steps": 1, "train_freq": 1, "learning_rate": 1e-3,
    "policy_kwargs": {"net_arch": [400, 300]},
}
_TD3_MUJOCO = {
    "n_timesteps": 1_000_000, "learning_starts": 10_000, "noise_type": "normal",
    "noise_std": 0.1, "train_freq": 1, "gradient_steps": 1, "learning_rate": 1e-3,
    "batch_size": 256, "policy_kwargs": {"net_arch": [400, 300]},
}
ZOO_TD3 = {
    "Pendulum-v1": {"n_timesteps": 20_000, **_TD3_CLASSIC},
    "LunarLander-v3": {
        "n_timesteps": 300_000, "env_kwargs": {"continuous": True}, **_TD3_CLASSIC,
    },
    "BipedalWalker-v3": {"n_timesteps": 1_000_000, **_TD3_CLASSIC},
    "Hopper-v5": _TD3_MUJOCO,
    "HalfCheetah-v5": _TD3_MUJOCO,
    "Walker2d-v5": _TD3_MUJOCO,
}
