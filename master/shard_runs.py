"""The facade's part for runs with shards (a part of master/state.py `ClusterState`): starting the
shards with the run, a push's commit (the ledger admits and counts, the parameter server decides),
and what happens when a shard fails."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from a3c_http.wire.protocol import ROLLOUT_METADATA
from master.errors import Invalid, StateConflict
from master.learner_runs import rollout_report
from master.learning.rounds import Update
from master.run.events import ERROR, WARNING
from master.shards.coordinator import RESTARTS, ShardsDown

if TYPE_CHECKING:
    from master.api.shards import Commit


class ShardRuns:
    """The mixin; `ClusterState` has the `ledger`, `params` and `settings` it uses."""

    def _start_shards(self) -> None:
        """A running run with `shards` above 1 gets its shard processes (an earlier run's were
        closed by `start_run`)."""
        config = self.ledger.config
        if getattr(config, "shards", 1) < 2 or self.ledger.run_state != "running":
            return
        try:
            self.params.start_shards(self.settings, config, self._shards_failed)
        except Exception as exc:  # noqa: BLE001 - the run cannot go on without them, whatever it was
            why = f"the run's parameter-server shards could not start: {exc}"
            self.finish(why)
            raise ShardsDown(why) from None

    def _shards_failed(self, reason: str) -> None:
        """A shard failed (the shards' watcher thread): pushes wait (503) while every shard is put
        back to the network as last gathered; after RESTARTS failed tries the run ends."""
        events = self.ledger.events
        events.add(WARNING, "shard_failed", reason)
        events.flush()
        problem = None
        for _ in range(RESTARTS):
            try:
                version = self.params.reset_shards()
            except Exception as exc:  # noqa: BLE001 - whatever it was, it is the run's end's reason
                problem = f"{type(exc).__name__}: {exc}"
                continue
            events.add(WARNING, "shards_reset", f"every shard is back at version {version}")
            events.flush()
            return
        events.add(ERROR, "shards_lost", f"{reason}; starting them again failed: {problem}")
        self.params.drop_shards()
        self.finish(f"a parameter-server shard failed and could not be started again: {problem}")

    def shard_plan(self, seen_as: str | None = None) -> dict[str, Any]:
        """The running run's shards for a worker that reaches the master at `seen_as`."""
        shards = self.params.shards
        if shards is None:
            raise StateConflict("the run has no shards: its workers push to POST /gradients")
        return {"run_id": self.ledger.run_id, **shards.plan(seen_as)}

    def commit_sharded(self, commit: Commit) -> dict[str, Any]:
        """A push staged on every shard (master/api/shards.py `Commit`): admitted as every push
        (the run, the worker; a finished run's refused unless a retry), its receipts checked
        (master/shards/coordinator.py `verify`, the norm against max_grad_norm), its report
        counted, then screened and decided by the parameter server."""
        ledger, params = self.ledger, self.params
        refusal, config, _ = ledger.admit_update(commit.worker_id, commit.run_id)
        shards = params.shards
        if shards is None or getattr(config, "shards", 1) < 2:
            raise StateConflict("the run has no shards: its workers push to POST /gradients")
        receipts = [r.model_dump() for r in commit.receipts]
        try:
            norm = shards.verify(receipts, commit.worker_id, commit.seq)
        except Invalid:
            params.count_invalid()  # as a gradient body that does not fit is counted
            raise
        params.check_norm(norm, config)
        report = rollout_report({ROLLOUT_METADATA: commit.report} if commit.report else {})
        summary = self._count_rollout(commit.worker_id, report, commit.run_id, commit.seq)
        self._schedule_learning_rate(config)
        update = Update(
            commit.worker_id, commit.version, None, commit.seq, commit.loss,
            max(commit.grad_norm or 0.0, norm),
        )  # fmt: skip
        version, duplicate = params.commit_sharded(update, config, refusal)
        if duplicate and not summary["duplicate"]:
            ledger.count_duplicate(commit.worker_id)
        return {**summary, "version": version, "duplicate": duplicate}
