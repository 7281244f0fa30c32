"""This project's own small tasks, registered under the `a3c_http/` namespace (a3c_http/envs/make.py
`register_family` registers them on first use).

`a3c_http/CueMemory-v0` asks for memory and nothing else: the first observation shows a cue (one
of two), the next `delay` show nothing, and the last asks which cue it was. Answering right earns
+1, wrong -1; the actions before the question earn nothing. A policy without memory sees the same
question whichever cue came first, so it is right half the time (mean return 0 in the long run); a
recurrent one (`core: "lstm"`) remembers the cue and earns 1 an episode. It is the known-answer test
of the recurrent path (tests/unit/test_learning.py) and a row of `scripts/bench.py learn`, in the
spirit of POPGym's RepeatFirst and the T-maze of Bakker (2001).

`a3c_http/CartPoleNoVel-v1` is CartPole-v1 with its two velocities left out of the observation
(the cart's position and the pole's angle remain), as the RL Zoo's CartPoleNoVel-v1 that
SB3-contrib's RecurrentPPO is benchmarked on: a policy must infer the velocities from what it saw
before, so it needs memory to balance the pole for long.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

CUE_MEMORY = "a3c_http/CueMemory-v0"
CARTPOLE_NO_VELOCITY = "a3c_http/CartPoleNoVel-v1"


class CueMemory(gym.Env):
    """Observations `[cue is 0, cue is 1, question]`; two actions; `delay + 2` steps an
    episode (the cue, the blanks, the question)."""

    metadata = {"render_modes": []}

    def __init__(self, delay: int = 4) -> None:
        if delay < 0:
            raise ValueError(f"delay must be at least 0, not {delay}")
        self.delay = delay
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._cue = 0
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(3, dtype=np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        elif self._t == self.delay + 1:
            obs[2] = 1.0
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._cue = int(self.np_random.integers(2))
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self._t == self.delay + 1:  # the question: the answer ends the episode
            reward = 1.0 if int(action) == self._cue else -1.0
            return np.zeros(3, dtype=np.float32), reward, True, False, {}
        self._t += 1
        return self._obs(), 0.0, False, False, {}


class CartPoleNoVelocity(CartPoleEnv):
    """CartPole whose observations are `[cart position, pole angle]`."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        high = np.array([self.x_threshold * 2, self.theta_threshold_radians * 2], np.float32)
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed, options=options)
        return obs[[0, 2]], info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[[0, 2]], reward, terminated, truncated, info


def register() -> None:
    """Register this module's tasks with gymnasium (once)."""
    if CUE_MEMORY not in gym.registry:
        gym.register(CUE_MEMORY, entry_point=CueMemory, reward_threshold=0.9)
    if CARTPOLE_NO_VELOCITY not in gym.registry:
        gym.register(CARTPOLE_NO_VELOCITY, entry_point=CartPoleNoVelocity,
                     max_episode_steps=500, reward_threshold=475.0)  # fmt: skip
