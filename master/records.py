"""The plain records of the master's state: a worker's entry in the registry and the run's
counters. They hold no locks; ClusterState (master/state.py) guards every access."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

WorkerState = Literal["starting", "running", "done", "lost", "failed"]
ACTIVE = ("starting", "running")
# API.md's avg = 0.99*avg + 0.01*r, with these very constants (1 - 0.99 is not 0.01 in floats), so
# anyone who folds the history again gets exactly the master's value.
MOVING_AVERAGE_DECAY, MOVING_AVERAGE_WEIGHT = 0.99, 0.01


@dataclass
class WorkerRecord:
    worker_id: str
    url: str | None
    state: WorkerState
    last_seen: float  # wall clock, so it survives a restart
    episodes: int = 0
    steps: int = 0
    steps_per_s: float | None = None
    last_reward: float | None = None
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # The highest X-A3C-Seq of an episode report taken from this worker, and how many retries of
    # requests already taken were answered without being counted again.
    last_seq: int = 0
    duplicates: int = 0
    # The master is still waiting for this worker's answer to POST /start_worker: its silence
    # does not count yet (the launch has its own timeout).
    launching: bool = False

    def public(self, now: float) -> dict[str, Any]:
        out = asdict(self)
        del out["last_seen"], out["launching"]
        out["last_seen_s"] = round(max(0.0, now - self.last_seen), 3)
        return out


@dataclass
class Stats:
    """The run's counters: all guarded by ClusterState._lock."""

    global_episode: int = 0
    global_steps: int = 0
    best_score: float | None = None
    moving_average: float | None = None
    last100: deque = field(default_factory=lambda: deque(maxlen=100))
    queue: deque = field(default_factory=deque)
    queue_dropped: int = 0

    def fold_average(self, reward: float) -> float:
        if self.moving_average is None:
            self.moving_average = reward
        else:
            self.moving_average = (
                MOVING_AVERAGE_DECAY * self.moving_average + MOVING_AVERAGE_WEIGHT * reward
            )
        return self.moving_average

    def raise_best(self, score: float) -> bool:
        if self.best_score is None or score > self.best_score:
            self.best_score = score
            return True
        return False

    def mean_return_100(self) -> float | None:
        return sum(self.last100) / len(self.last100) if self.last100 else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["last100"] = list(self.last100)
        out["queue"] = list(self.queue)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stats:
        return cls(
            global_episode=int(data.get("global_episode", 0)),
            global_steps=int(data.get("global_steps", 0)),
            best_score=data.get("best_score"),
            moving_average=data.get("moving_average"),
            last100=deque(data.get("last100", []), maxlen=100),
            queue=deque(data.get("queue", [])),
            queue_dropped=int(data.get("queue_dropped", 0)),
        )
