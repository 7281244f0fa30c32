"""WebCrawl: a focused crawler on a small random web site.

The crawler stands on a page and sees the page's outgoing links, a fixed number of them. Each link
shows two numbers: a *hint*, how much its anchor text looks like the topic the crawl is after (a
score in [0, 1]: links to on-topic pages tend to score high, but the two ranges overlap), and
whether the page it leads to was visited already. The crawler follows one link a step. Reaching an
on-topic page it has not seen before pays +1; every step costs `step_cost` (a request is not
free). The crawl ends when `goal` on-topic pages are found, or at the episode cap of the
registration (`max_episode_steps`).

Each episode crawls a new site, drawn from the reset's seed, so the policy cannot learn a map: it
must learn to read the hints (and to skip visited pages). A crawler that follows the best hint
finds the goal in about 8 steps (a return of about 3.4); one that clicks at random needs about 25
(a return near 0).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class WebCrawlEnv(gym.Env):
    """Observation: `[hint, visited] x links` then `[found / goal]`, float32 in [0, 1].
    Action: the index of the link to follow (Discrete(links))."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        pages: int = 50,
        links: int = 4,
        relevant_fraction: float = 0.3,
        goal: int = 5,
        step_cost: float = 0.2,
        render_mode: str | None = None,
    ) -> None:
        if not 0 < relevant_fraction < 1:
            raise ValueError(f"relevant_fraction must be in (0, 1), not {relevant_fraction}")
        if links < 2 or pages < links or goal < 1:
            raise ValueError("need links >= 2, pages >= links and goal >= 1")
        self.pages, self.links, self.goal = pages, links, goal
        self.relevant_fraction, self.step_cost = relevant_fraction, step_cost
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(2 * links + 1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(links)
        self._relevant = np.zeros(pages, dtype=bool)
        self._outlinks = np.zeros((pages, links), dtype=np.int64)
        self._hints = np.zeros((pages, links), dtype=np.float32)
        self._visited = np.zeros(pages, dtype=bool)
        self._page = 0
        self._found = 0

    def _new_site(self) -> None:
        """Pages on or off the topic; each page's links to other pages, with their hints: on-topic
        targets score in [0.4, 1], others in [0, 0.6]."""
        rng = self.np_random
        self._relevant = rng.random(self.pages) < self.relevant_fraction
        self._relevant[0] = False  # the seed URL the crawl starts from
        for page in range(self.pages):
            others = np.delete(np.arange(self.pages), page)
            self._outlinks[page] = rng.choice(others, size=self.links, replace=False)
        on_topic = self._relevant[self._outlinks]
        self._hints = np.where(
            on_topic,
            rng.uniform(0.4, 1.0, on_topic.shape),
            rng.uniform(0.0, 0.6, on_topic.shape),
        ).astype(np.float32)

    def _obs(self) -> np.ndarray:
        targets = self._outlinks[self._page]
        links = np.stack([self._hints[self._page], self._visited[targets]], axis=1)
        found = np.float32(self._found / self.goal)
        return np.append(links.reshape(-1), found).astype(np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._new_site()
        self._visited = np.zeros(self.pages, dtype=bool)
        self._page, self._found = 0, 0
        self._visited[0] = True
        return self._obs(), {"found": 0}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not a link index in {self.action_space}")
        target = int(self._outlinks[self._page, int(action)])
        reward = -self.step_cost
        if self._relevant[target] and not self._visited[target]:
            reward += 1.0
            self._found += 1
        self._visited[target] = True
        self._page = target
        terminated = self._found >= self.goal
        return self._obs(), float(reward), terminated, False, {"found": self._found}

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        hints = " ".join(
            f"{h:.2f}{'*' if self._visited[t] else ''}"
            for h, t in zip(self._hints[self._page], self._outlinks[self._page], strict=True)
        )
        return f"page {self._page:3d}  found {self._found}/{self.goal}  links: {hints}\n"


def best_hint(obs: np.ndarray, links: int = 4) -> int:
    """The hand-written crawler: the unvisited link with the best hint (any link when all were
    visited). What a trained policy should match."""
    pairs = np.asarray(obs)[: 2 * links].reshape(links, 2)
    scores = np.where(pairs[:, 1] > 0.5, -1.0, pairs[:, 0])
    return int(np.argmax(scores))
