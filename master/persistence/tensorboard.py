"""TensorBoard scalars of the run, under the names Stable-Baselines3 users chart, written by the
master into `<run folder>/tensorboard/<run id>/` when the `tensorboard` extra is installed.

Every `INTERVAL_S` the housekeeping thread hands `tick` a `/status` snapshot; the scalars are
stepped by the run's env steps:
- `rollout/ep_rew_mean`: the mean return of the last 100 episodes;
- `rollout/ep_len_mean`: the mean length of the episodes finished since the last tick;
- `time/fps`: env steps per second since the last tick;
- `train/policy_loss`, `train/value_loss`, `train/entropy`: the mean over the workers of the
  latest values they reported;
- with a learner (ppo, impala): its latest update's `train/*` as SB3's PPO names them
  (`train/clip_fraction`, `train/approx_kl`, `train/policy_gradient_loss`, `train/value_loss`,
  `train/entropy_loss`, `train/explained_variance`, `train/learning_rate`, `train/clip_range`, ...);
- `eval/mean_reward`: each new evaluation of the global weights.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

INTERVAL_S = 5.0
TRAIN_SCALARS = ("train/policy_loss", "train/value_loss", "train/entropy")


def available() -> bool:
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:  # the `tensorboard` extra is not installed
        return False
    return True


class TensorBoard:
    def __init__(self, run_dir: Path) -> None:
        self.root = Path(run_dir) / "tensorboard"
        self._writer: Any = None
        self._run_id: str | None = None
        self._last: tuple[float, int, int, int] | None = None  # time, env steps, episodes, steps
        self._evaluations = 0

    def tick(self, status: dict[str, Any]) -> None:
        """Write the scalars of this `/status` snapshot (nothing before a run, or when the run
        is over and its last figures are written)."""
        run_id = status["run_id"]
        if run_id is None:
            return
        if run_id != self._run_id:
            self.close()
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.root / run_id))
            self._run_id, self._last, self._evaluations = run_id, None, 0
        now, step = time.monotonic(), status["env_steps"]
        episodes, steps = status["global_episode"], status["global_steps"]
        if self._last is not None and self._last[1:] == (step, episodes, steps):
            return  # nothing happened since (a finished run, or an idle one)
        write = self._writer.add_scalar
        if status["mean_return_100"] is not None:
            write("rollout/ep_rew_mean", status["mean_return_100"], step)
        if self._last is not None:
            then, last_step, last_episodes, last_steps = self._last
            if episodes > last_episodes:
                mean_length = (steps - last_steps) / (episodes - last_episodes)
                write("rollout/ep_len_mean", mean_length, step)
            if now > then:
                write("time/fps", (step - last_step) / (now - then), step)
        for name in TRAIN_SCALARS:
            values = [w["metrics"][name] for w in status["workers"] if name in w["metrics"]]
            if values:
                write(name, statistics.fmean(values), step)
        for name, value in ((status.get("learner") or {}).get("metrics") or {}).items():
            if value == value:  # not NaN (explained_variance of a constant target)
                write(name, value, step)
        evaluations = status.get("evaluations", 0)
        if evaluations > self._evaluations and status["eval_mean_return"] is not None:
            write("eval/mean_reward", status["eval_mean_return"], status["eval_global_steps"])
            self._evaluations = evaluations
        self._writer.flush()
        self._last = (now, step, episodes, steps)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
