"""IMPALA's defaults and per-task presets."""

from __future__ import annotations

from typing import Any

from a3c_http.algos.a3c.presets import ATARI

# IMPALA starts from the IMPALA paper's (Espeholt et al. 2018) unrolls of 20 steps, RMSprop, an
# entropy bonus of 0.01, one step a batch of rollouts.
DEFAULTS: dict[str, Any] = {
    "lr": 6e-4,
    "n_epochs": 1,
    "t_max": 20,
    "num_envs": 8,
    "queue_size": 2,
    "entropy_coef": 0.01,
    "max_policy_lag": 16,
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
IMPALA_PRESETS["ALE/*"] = IMPALA_PRESETS["ALE/Breakout-v5"]
