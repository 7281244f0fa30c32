"""Environments for the tests, registered on import (`tests.support.envs:FailingCartPole-v0`)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class FailingCartPole(CartPoleEnv):
    """CartPole that raises after `fail_after` steps, as a broken simulator would."""

    def __init__(self, fail_after: int = 50, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_after = fail_after
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > self.fail_after:
            raise RuntimeError(f"simulator crashed after {self.fail_after} steps")
        return super().step(action)


if "FailingCartPole-v0" not in gym.registry:
    gym.register("FailingCartPole-v0", entry_point=FailingCartPole, max_episode_steps=500)


class Payout(gym.Env):
    """Each step pays the action it is given, as given: Discrete(2) pays 0 or 1, `continuous`
    the first value of a Box action in [-1, 1] (unclipped: 3.0 pays 3.0). The observation is
    always zero; an episode ends after `length` steps, never with `length=None` (and no time
    limit is registered)."""

    def __init__(self, continuous: bool = False, length: int | None = 5) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = (
            gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(2)
        )
        self.length = length
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        reward = float(np.asarray(action, dtype=np.float64).reshape(-1)[0])
        ended = self.length is not None and self.t >= self.length
        return np.zeros(1, np.float32), reward, ended, False, {}


if "Payout-v0" not in gym.registry:
    gym.register("Payout-v0", entry_point=Payout)


class Knobs(gym.Env):
    """Two knobs of their own ranges (a Box of actions whose dimensions differ: [-2, 2] and
    [0, 1]); each step shows a random point in [-1, 1]^2 and pays minus the squared distance
    of the knobs from it, mapped into their ranges. Five steps an episode."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(
            np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32)
        )
        self.t = 0
        self._point = np.zeros(2, np.float32)

    def _show(self) -> np.ndarray:
        self._point = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return self._point

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._show(), {}

    def step(self, action):
        self.t += 1
        wanted = self._point * np.array([2.0, 0.5]) + np.array([0.0, 0.5])
        reward = -float(np.sum((np.asarray(action, dtype=np.float64) - wanted) ** 2))
        return self._show(), reward, self.t >= 5, False, {}


if "Knobs-v0" not in gym.registry:
    gym.register("Knobs-v0", entry_point=Knobs)
