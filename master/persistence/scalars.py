"""The scalars the master charts for a run, under the names Stable-Baselines3 users chart: computed
once from each `/status` snapshot and handed to every sink (TensorBoard: tensorboard.py; Weights &
Biases: wandb_sink.py), which only writes them.

Every `INTERVAL_S` the housekeeping thread hands `Scalars.tick` a `/status` snapshot; the scalars
are stepped by the run's env steps:
- `rollout/ep_rew_mean`: the mean return of the last 100 episodes;
- `rollout/ep_len_mean`: the mean length of the episodes finished since the last tick;
- `time/fps`: env steps per second since the last tick;
- `train/policy_loss`, `train/value_loss`, `train/entropy`: the mean over the workers of the
  latest values they reported;
- with a learner (ppo, impala): its latest update's `train/*` as SB3's PPO names them
  (`train/clip_fraction`, `train/approx_kl`, `train/policy_gradient_loss`, `train/value_loss`,
  `train/entropy_loss`, `train/explained_variance`, `train/learning_rate`, `train/clip_range`, ...);
- `eval/mean_reward`: each new evaluation of the global weights, at the env steps its weights
  were taken (which may be before the step of the tick's other scalars).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Protocol

INTERVAL_S = 5.0
TRAIN_SCALARS = ("train/policy_loss", "train/value_loss", "train/entropy")

Point = tuple[str, float, int]  # name, value, env steps


@dataclass(frozen=True)
class Figures:
    """One tick's figures for the sinks: the run, whether it still runs, its training config and
    the points new since the last tick (none when nothing happened)."""

    run_id: str
    running: bool
    config: dict[str, Any] | None
    points: tuple[Point, ...]


class Sink(Protocol):
    """Where the figures go. `name` is the housekeeping chore that writes them (a failure of one
    sink is logged and retried on its own: it never stops the others)."""

    name: str

    def write(self, figures: Figures) -> None: ...

    def close(self) -> None: ...


class Scalars:
    """The computation, with what it needs to remember between ticks (the last tick's counts, the
    evaluations already charted), started again for each new run."""

    def __init__(self) -> None:
        self._run_id: str | None = None
        self._last: tuple[float, int, int, int] | None = None  # time, env steps, episodes, steps
        self._evaluations = 0

    def tick(self, status: dict[str, Any]) -> Figures | None:
        """The figures of this `/status` snapshot; None before any run."""
        run_id = status["run_id"]
        if run_id is None:
            return None
        if run_id != self._run_id:
            self._run_id, self._last, self._evaluations = run_id, None, 0
        running, config = status["state"] == "running", status["config"]
        now, step = time.monotonic(), status["env_steps"]
        episodes, steps = status["global_episode"], status["global_steps"]
        if self._last is not None and self._last[1:] == (step, episodes, steps):
            return Figures(run_id, running, config, ())  # nothing happened since
        points: list[Point] = []
        if status["mean_return_100"] is not None:
            points.append(("rollout/ep_rew_mean", status["mean_return_100"], step))
        if self._last is not None:
            then, last_step, last_episodes, last_steps = self._last
            if episodes > last_episodes:
                mean_length = (steps - last_steps) / (episodes - last_episodes)
                points.append(("rollout/ep_len_mean", mean_length, step))
            if now > then:
                points.append(("time/fps", (step - last_step) / (now - then), step))
        for name in TRAIN_SCALARS:
            values = [w["metrics"][name] for w in status["workers"] if name in w["metrics"]]
            if values:
                points.append((name, statistics.fmean(values), step))
        for name, value in ((status.get("learner") or {}).get("metrics") or {}).items():
            if value == value:  # not NaN (explained_variance of a constant target)
                points.append((name, value, step))
        evaluations = status.get("evaluations", 0)
        if evaluations > self._evaluations and status["eval_mean_return"] is not None:
            points.append(("eval/mean_reward", status["eval_mean_return"],
                           status["eval_global_steps"]))  # fmt: skip
            self._evaluations = evaluations
        self._last = (now, step, episodes, steps)
        return Figures(run_id, running, config, tuple(points))
