"""The plain records of the master's state: a worker's entry in the registry, the run's counters
and its evaluations. They hold no locks; the run ledger (master/run/ledger.py) guards every
access."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from a3c_http.store.runstore import EVALUATION_FIELDS
from master.learning.admission import SeqWindow

if TYPE_CHECKING:
    from a3c_http.config.training import TrainConfig

WorkerState = Literal["starting", "running", "done", "lost", "failed"]
ACTIVE = ("starting", "running")
# How a worker came into the run: started by the master (workers.txt, POST /train's `workers`),
# registered by itself under its own id (POST /worker_started), or joined by itself and given an
# id and the run (POST /join, a worker with A3C_MASTER_URL).
WorkerOrigin = Literal["launched", "registered", "joined"]
# docs/http-api.md's avg = 0.99*avg + 0.01*r, with these very constants (1 - 0.99 is not 0.01
# in floats), so anyone who folds the history again gets exactly the master's value.
MOVING_AVERAGE_DECAY, MOVING_AVERAGE_WEIGHT = 0.99, 0.01


@dataclass
class WorkerRecord:
    worker_id: str
    url: str | None
    state: WorkerState
    last_seen: float  # wall clock, so it survives a restart
    episodes: int = 0
    steps: int = 0  # the lengths of its episodes reported so far
    # Every environment step it took, as its last heartbeat said: with `steps`, the steps of
    # episodes still going on count too, so `max_steps` fires on an environment that never ends.
    env_steps: int = 0
    steps_per_s: float | None = None
    last_reward: float | None = None
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # The highest X-A3C-Seq of an episode report taken from this worker, the numbers below it
    # taken too (master/learning/admission.py: reports in flight arrive out of order), and how many
    # retries of requests already taken were answered without being counted again.
    last_seq: int = 0
    seq_mask: int = SeqWindow().mask
    duplicates: int = 0
    # The master is still waiting for this worker's answer to POST /start_worker: its silence
    # does not count yet (the launch has its own timeout).
    launching: bool = False
    # The exploration settings the master derived for it and sent in POST /start_worker
    # (a3c_http/algos/exploration.py); None for a worker the master did not start.
    exploration: dict[str, float] | None = None
    # When `env_steps` was last reported (wall clock): how fast it may grow
    # (master/learning/admission.py).
    stats_at: float = 0.0
    origin: WorkerOrigin = "registered"
    # What the worker calls itself (a joined worker's A3C_WORKER_NAME: its host and port, or its
    # pod's name), so that /status says which host or pod an id is.
    name: str | None = None

    def seen_seq(self, seq: int) -> bool:
        """Episode-report number `seq` was taken before (this is a retry)."""
        return SeqWindow(self.last_seq, self.seq_mask).seen(seq)

    def take_seq(self, seq: int) -> None:
        """Record episode-report number `seq` as taken."""
        window = SeqWindow(self.last_seq, self.seq_mask)
        window.add(seq)
        self.last_seq, self.seq_mask = window.high, window.mask

    def take_stats(self, stats: dict[str, Any]) -> None:
        """What a heartbeat (or a gradient push) says of the worker's progress (judged
        plausible by the caller)."""
        for key in ("steps_per_s", "last_reward", "metrics", "env_steps"):
            if stats.get(key) is not None:
                setattr(self, key, stats[key])
        if stats.get("env_steps") is not None:
            self.stats_at = time.time()

    def steps_in_progress(self) -> int:
        return max(0, self.env_steps - self.steps)

    def public(self, now: float) -> dict[str, Any]:
        out = asdict(self)
        del out["last_seen"], out["launching"], out["seq_mask"], out["stats_at"]
        out["last_seen_s"] = round(max(0.0, now - self.last_seen), 3)
        return out


@dataclass
class Stats:
    """The run's counters. `global_steps` sums the lengths of the reported episodes.
    The FIFO's entries are numbered: `queue_head` is the number of the oldest one, so a save
    writes only the entries pushed since the last one and deletes those popped."""

    global_episode: int = 0
    global_steps: int = 0
    best_score: float | None = None
    moving_average: float | None = None
    last100: deque = field(default_factory=lambda: deque(maxlen=100))
    queue: deque = field(default_factory=deque)
    queue_head: int = 0
    queue_dropped: int = 0

    def push(self, value: float, limit: int) -> None:
        if len(self.queue) >= limit:
            self.queue.popleft()
            self.queue_head += 1
            self.queue_dropped += 1
        self.queue.append(value)

    def pop(self) -> float | None:
        if not self.queue:
            return None
        self.queue_head += 1
        return self.queue.popleft()

    def clear_queue(self) -> None:
        self.queue_head += len(self.queue)
        self.queue.clear()

    def queue_since(self, position: int) -> list[tuple[int, float]]:
        """The FIFO's entries numbered `position` and later, with their numbers."""
        skip = max(0, position - self.queue_head)
        return [(self.queue_head + i, v) for i, v in enumerate(self.queue) if i >= skip]

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
        """Everything but the FIFO's entries, which the run folder keeps in a table of their own."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "queue"}
        out["last100"] = list(self.last100)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], queue: list[tuple[int, float]]) -> Stats:
        return cls(
            global_episode=int(data.get("global_episode", 0)),
            global_steps=int(data.get("global_steps", 0)),
            best_score=data.get("best_score"),
            moving_average=data.get("moving_average"),
            last100=deque(data.get("last100", []), maxlen=100),
            queue=deque(value for _, value in queue),
            queue_head=queue[0][0] if queue else int(data.get("queue_head", 0)),
            queue_dropped=int(data.get("queue_dropped", 0)),
        )


# What an evaluation records of the weights it played and of how they played, in the order of the
# run folder's `evaluations` columns (between the evaluation's number and the time).
EVALUATION_VALUES = EVALUATION_FIELDS[1:-1]


@dataclass
class Evaluations:
    """The run's evaluations of its global weights (master/background/evaluator.py): how many so
    far, the latest, the error of the last one when it failed, and the history rows not saved yet
    (keyed by the evaluation's number, from 1)."""

    count: int = 0
    latest: dict[str, Any] | None = None
    error: str | None = None
    unsaved: list[tuple] = field(default_factory=list)

    def add(self, taken: dict[str, Any], result: dict[str, Any]) -> None:
        """`taken`: the model_version, elapsed_s and global_steps of the weights when they were
        taken; `result`: what a3c_http.policy.evaluation.evaluate found."""
        values = {**taken, **result}
        self.count += 1
        self.latest = {k: values[k] for k in EVALUATION_VALUES}
        self.error = None
        self.unsaved.append((self.count, *self.latest.values(), round(time.time(), 3)))

    def mean_return(self) -> float | None:
        return self.latest["mean_return"] if self.latest else None

    def public(self) -> dict[str, Any]:
        """The evaluation fields of /status: null (and 0) before the first evaluation."""
        latest = self.latest or {}
        out: dict[str, Any] = {f"eval_{k}": latest.get(k) for k in EVALUATION_VALUES}
        return {**out, "evaluations": self.count, "eval_error": self.error}

    def to_json(self) -> dict[str, Any]:
        """Everything but the rows, which the run folder keeps in a table of their own."""
        return {"count": self.count, "latest": self.latest, "error": self.error}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Evaluations:
        return cls(int(data.get("count", 0)), data.get("latest"), data.get("error"))


def solved_by(config: TrainConfig | None, stats: Stats, evals: Evaluations) -> str | None:
    """How the run reached its target_return: the mean return of the last 100 episodes (100
    needed), or with `solved_on=eval` that of the latest evaluation. None while it has not."""
    target = config.target_return if config else None
    if target is None:
        return None
    if config.solved_on == "eval":
        mean, judged = evals.mean_return(), "the latest evaluation"
    else:
        mean = stats.mean_return_100() if len(stats.last100) == 100 else None
        judged = "the last 100 episodes"
    if mean is None or mean < target:
        return None
    return f"mean return of {judged} {mean:.1f} >= {target}"
