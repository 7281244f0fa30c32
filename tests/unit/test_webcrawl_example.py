"""The worked example's environment (examples/webcrawl): a valid gymnasium environment, seeded
sites, and the gap its reward_threshold measures: a crawler that reads the hints reaches it, one
that clicks at random does not. Training it: tests/cluster/test_python_api.py."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def webcrawl() -> Any:
    sys.path.insert(0, str(ROOT / "examples" / "webcrawl"))
    try:
        import webcrawl

        yield webcrawl
    finally:
        sys.path.remove(str(ROOT / "examples" / "webcrawl"))


def returns(policy: Callable[[np.ndarray], int], episodes: int = 300) -> list[float]:
    env = gym.make("WebCrawl-v0")
    out = []
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            total, done = total + reward, terminated or truncated
        out.append(total)
    env.close()
    return out


def test_it_is_a_valid_gymnasium_environment(webcrawl: Any) -> None:
    check_env(gym.make("WebCrawl-v0").unwrapped, skip_render_check=False)
    spec = gym.spec("WebCrawl-v0")
    assert spec.max_episode_steps == 50 and spec.reward_threshold == 3.0
    env = gym.make("WebCrawl-v0", render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (9,) and obs.dtype == np.float32 and "found 0/5" in env.render()
    env.close()


def test_a_seed_draws_the_same_site(webcrawl: Any) -> None:
    a, b = webcrawl.WebCrawlEnv(), webcrawl.WebCrawlEnv()
    a.reset(seed=7)
    b.reset(seed=7)
    assert np.array_equal(a._outlinks, b._outlinks) and np.array_equal(a._hints, b._hints)
    b.reset(seed=8)
    assert not np.array_equal(a._outlinks, b._outlinks)


def test_the_threshold_needs_the_hints(webcrawl: Any) -> None:
    rng = np.random.default_rng(0)
    threshold = gym.spec("WebCrawl-v0").reward_threshold
    assert statistics.fmean(returns(webcrawl.best_hint)) > threshold + 0.2
    assert statistics.fmean(returns(lambda _: int(rng.integers(4)))) < threshold - 2
