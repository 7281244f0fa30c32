"""What a worker's word can be believed to be: the bounds the master holds every report to before it
counts anything (a refused report is a 422 and changes nothing).

A worker tells the master how its episodes ended and how many environment steps it took; the run's
counters, its best score, its "solved" and its `max_steps` are made of those words. A review found
one push of a 40-step rollout claiming 100,000 episodes counted, one episode of return 1e308 made
the best score (and a hundred would have solved the run), and one heartbeat claiming 9e18 env
steps ended the run. So:

- a rollout finishes at most `t_max x num_envs` episodes (each step ends at most one) and its
  statistics count at most as many samples;
- an episode is at most as long as the environment's time limit, when it has one, and its return
  lies within +-`MAX_ABS_RETURN` (the schemas' `Return`, master/api/schemas.py: it also keeps every
  sum and mean of returns finite);
- a worker's env steps grow at most `MAX_ENV_STEPS_PER_S` a second (far beyond any worker: a
  CartPole worker makes about 10,000 here) plus one rollout.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from a3c_http.config.training import TrainConfig, env_spec

MAX_ABS_RETURN = 1e9
MAX_ENV_STEPS_PER_S = 1_000_000
# An episode of an environment without a time limit (the schemas' own bound on a length).
MAX_LENGTH = 1_000_000_000


@dataclass(frozen=True)
class RunLimits:
    rollout_steps: int  # t_max x num_envs: the samples of one rollout
    max_length: int  # the longest episode: the environment's time limit, else MAX_LENGTH

    @classmethod
    def of(cls, config: TrainConfig) -> RunLimits:
        spec = env_spec(config.env_id)
        limit = config.env_kwargs.get("max_episode_steps", spec.max_episode_steps)
        max_length = int(limit) if isinstance(limit, int) and limit > 0 else MAX_LENGTH
        return cls(config.t_max * config.num_envs, max_length)

    def episodes_problem(self, episodes: Iterable[tuple[float, int]], pushed: bool) -> str | None:
        """What is implausible about these finished episodes, or None. `pushed`: they came with
        one rollout's gradients, so at most `rollout_steps` of them."""
        episodes = list(episodes)
        if pushed and len(episodes) > self.rollout_steps:
            return (
                f"{len(episodes)} episodes in one rollout: a rollout of t_max x num_envs = "
                f"{self.rollout_steps} steps finishes at most {self.rollout_steps}"
            )
        for _, length in episodes:
            if length > self.max_length:
                return (
                    f"an episode of {length} steps: this environment's episodes end after at "
                    f"most {self.max_length}"
                )
        return None

    def env_steps_problem(self, claimed: int, before: int, seconds: float) -> str | None:
        """What is implausible about a worker's claim of `claimed` env steps in all, `seconds`
        after it claimed `before`, or None."""
        most = before + MAX_ENV_STEPS_PER_S * max(seconds, 1.0) + self.rollout_steps
        if claimed <= most:
            return None
        return (
            f"env_steps {claimed}: this worker reported {before} {seconds:.1f} s ago, and a worker "
            f"takes at most {MAX_ENV_STEPS_PER_S:,} env steps a second"
        )
