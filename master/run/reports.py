"""What workers report, folded into the run's statistics under the run ledger's lock: finished
episodes (one by one with `POST /episode`, or a rollout's with its gradients), the worker's
statistics, and heartbeats. These are methods of the ledger (master/run/ledger.py `RunLedger`
inherits them), apart because they are an idea of their own; they use its lock, run, registry,
statistics, limits and events.

Retries are never counted twice: a worker numbers its episode reports (`X-A3C-Seq`); the numbers
counted for each worker are checked and recorded in the same critical section as the count, and
a retry of a report already counted gets the first attempt's reply without being counted again.

Only workers in the registry report (another id: 409, told to stop), and what they report must be
plausible (master/learning/admission.py, else 422 and nothing counted); a refused report is no
sign of life.
"""

from __future__ import annotations

import time
from typing import Any

from master.errors import Invalid
from master.run.records import WorkerRecord


class Reports:
    def heartbeat(self, worker_id: str, stats: dict[str, Any], run_id: str | None = None) -> bool:
        """Keep a worker running and take its statistics; True tells it to stop."""
        with self.lock:
            if self.should_stop(run_id):
                return True
            record = self.workers.require(worker_id)
            self._check_stats(record, stats)
            self._touch(worker_id).take_stats(stats)
            self._finish_if_done()
            return self.run_state != "running"

    def _check_stats(self, record: WorkerRecord, stats: dict[str, Any] | None) -> None:
        claimed = (stats or {}).get("env_steps")
        if claimed is None or self.limits is None:
            return
        why = self.limits.env_steps_problem(
            claimed, record.env_steps, time.time() - record.stats_at
        )
        if why is not None:
            raise Invalid(f"implausible report of worker {record.worker_id!r}: {why}")

    def report_episode(
        self,
        worker_id: str,
        reward: float,
        length: int,
        run_id: str | None = None,
        seq: int | None = None,
    ) -> dict[str, Any]:
        """Fold one finished episode into every statistic at once (`report_rollout`)."""
        return self.report_rollout(worker_id, [(reward, length)], None, run_id, seq, pushed=False)

    def report_rollout(
        self,
        worker_id: str,
        episodes: list[tuple[float, int]],
        stats: dict[str, Any] | None,
        run_id: str | None = None,
        seq: int | None = None,
        pushed: bool = True,
    ) -> dict[str, Any]:
        """Fold the finished episodes of a rollout into every statistic at once, and take the
        worker's statistics as a heartbeat does (`pushed`: they came with a rollout's gradients,
        so at most as many as it has steps). Raises Invalid, counting nothing, for an
        implausible report (master/learning/admission.py). Accepted in any state of the current
        run (an episode that ended just after the finish still happened); `stop` tells the
        worker whether to go on. A report whose `seq` this worker already used is a retry:
        answered like the first time (`duplicate: true`), counted once."""
        with self.lock:
            self.check_same_run(run_id)
            record = self.workers.require(worker_id)
            if seq is not None and record.seen_seq(seq):
                self._touch(worker_id)
                return self._duplicate_episode(record, seq)
            why = self.limits.episodes_problem(episodes, pushed) if self.limits else None
            if why is not None:
                raise Invalid(f"implausible report of worker {worker_id!r}: {why}")
            self._check_stats(record, stats)
            self._touch(worker_id)
            if seq is not None:
                record.take_seq(seq)
            stats_now = self.stats
            improved = False
            for reward, length in episodes:
                stats_now.global_episode += 1
                stats_now.global_steps += length
                stats_now.push(stats_now.fold_average(reward), self.queue_max)
                stats_now.last100.append(reward)
                if stats_now.raise_best(reward):
                    improved = True
                    self.events.best_score(worker_id, reward, stats_now.global_episode)
                record.episodes += 1
                record.steps += length
                record.last_reward = reward
                self.unsaved_rows.append(
                    (stats_now.global_episode, worker_id, reward, length, round(time.time(), 3))
                )
            # Reports in flight may land out of order: only the newest one's figures are kept.
            if stats and (seq is None or seq == record.last_seq):
                record.take_stats(stats)
            self._finish_if_done()
            reply = self._episode_reply(improved, duplicate=False)
            if seq is not None:
                self._episode_replies[worker_id] = (seq, reply)
            return reply

    def _episode_reply(self, improved: bool, duplicate: bool) -> dict[str, Any]:
        stats = self.stats
        return {
            "global_episode": stats.global_episode,
            "moving_average": stats.moving_average,
            "best_score": stats.best_score,
            "improved": improved,
            "stop": self.run_state != "running",
            "duplicate": duplicate,
        }

    def _duplicate_episode(self, record: WorkerRecord, seq: int) -> dict[str, Any]:
        """The first attempt's reply when it is the last one kept, else the current summary."""
        record.duplicates += 1
        last_seq, reply = self._episode_replies.get(record.worker_id, (None, None))
        if last_seq != seq or reply is None:
            return self._episode_reply(improved=False, duplicate=True)
        return {**reply, "stop": self.run_state != "running", "duplicate": True}
