"""Environments for the tests, registered on import (`tests.envs:FailingCartPole-v0`)."""

from __future__ import annotations

import gymnasium as gym
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
