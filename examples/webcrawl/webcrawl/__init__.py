"""A toy focused-crawler environment for gymnasium: importing this package registers
`WebCrawl-v0` (train it with a3c-http as `webcrawl:WebCrawl-v0`)."""

from __future__ import annotations

import gymnasium as gym

from webcrawl.env import WebCrawlEnv, best_hint

__all__ = ["ENV_ID", "WebCrawlEnv", "best_hint"]

ENV_ID = "WebCrawl-v0"

if ENV_ID not in gym.registry:
    gym.register(
        ENV_ID,
        entry_point="webcrawl.env:WebCrawlEnv",
        max_episode_steps=50,
        reward_threshold=3.0,
    )
