"""The original design's counters as its endpoints use them (master/api/original.py): the best
score, the episode counter, the moving average and the FIFO, each read or changed under the
ledger's lock, as the episode reports change them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from master.run.ledger import RunLedger


class OriginalCounters:
    def __init__(self, ledger: RunLedger) -> None:
        self._ledger = ledger

    def push_queue(self, value: float) -> int:
        with self._ledger.lock:
            stats = self._ledger.stats
            stats.push(value, self._ledger.queue_max)
            return len(stats.queue)

    def pop_queue(self) -> float | None:
        with self._ledger.lock:
            return self._ledger.stats.pop()

    def clear_queue(self) -> None:
        with self._ledger.lock:
            self._ledger.stats.clear_queue()

    def add_episodes(self, n: int) -> int:
        with self._ledger.lock:
            self._ledger.stats.global_episode += n
            return self._ledger.stats.global_episode

    def fold_average(self, reward: float) -> float:
        with self._ledger.lock:
            return self._ledger.stats.fold_average(reward)

    def raise_best(self, score: float) -> tuple[float, bool]:
        with self._ledger.lock:
            raised = self._ledger.stats.raise_best(score)
            return self._ledger.stats.best_score, raised
