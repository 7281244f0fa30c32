"""Persistence: one path from the master's state to its run folder.

One mutex covers taking a snapshot, writing it and archiving a run, so saves land in the order
they were taken: a snapshot taken first can never be written over a later one. The snapshot is
taken under the ledger's and the parameter server's locks (in that order, see master/state.py) and
written after they are released, so no request ever waits for the disk; only another save does.

Nothing marks the state "dirty": a save compares what it would write with what it last wrote and
writes only when something changed (the weights by their version, the rest by value), and only
what changed (new episode and evaluation rows and FIFO entries, weights of a new version).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from a3c_http.store import RunStore, Snapshot
from master.ledger import RunLedger
from master.params import ParameterServer

T = TypeVar("T")


@dataclass(frozen=True)
class _Marks:
    """What a snapshot holds, to tell the next save what is on disk already."""

    state: dict[str, Any] | None = None
    version: int | None = None
    temporary: int = -1
    queue_head: int = 0
    queue_end: int = 0


class Persister:
    def __init__(self, store: RunStore, ledger: RunLedger, params: ParameterServer) -> None:
        self.store = store
        self.ledger = ledger
        self.params = params
        self.mutex = threading.Lock()
        self._saved = _Marks()

    def save(self, force: bool = False, clean: bool = False) -> bool:
        """Write the state to the run folder if anything changed (or `force`). `clean`: this is
        the last save of a process that shuts down, so nothing happens after it."""
        with self.mutex:
            return self._write(self._take(force, clean))

    def switch_run(self, swap: Callable[[], T]) -> T:
        """Start a new run: `swap()` (called under both locks) replaces the old run's state by the
        new one's. The old run's last changes are saved, its files archived, then the new run
        saved, all before any other save can land. Returns what `swap` returns."""
        with self.mutex:
            with self.ledger.lock, self.params.lock:
                old_run_id = self.ledger.run_id
                last = self._take(force=False, clean=False) if old_run_id else None
                result = swap()
            self._write(last)
            if old_run_id is not None:
                self.store.archive(old_run_id)
                self._saved = _Marks()  # the folder holds nothing of the new run yet
            self._write(self._take(force=True, clean=False))
            return result

    def _take(self, force: bool, clean: bool) -> tuple[Snapshot, _Marks] | None:
        ledger, params, saved = self.ledger, self.params, self._saved
        with ledger.lock, params.lock:
            stats = ledger.stats
            marks = _Marks(
                state={**ledger.state(), **params.state()},
                version=params.version if params.model is not None else None,
                temporary=params.temporary_revision,
                queue_head=stats.queue_head,
                queue_end=stats.queue_head + len(stats.queue),
            )
            rows, evaluations = list(ledger.unsaved_rows), list(ledger.evals.unsaved)
            if not force and not rows and not evaluations and marks == saved:
                return None
            weights, optimizer = (
                params.blobs() if marks.version not in (None, saved.version) else (None, None)
            )
            config = ledger.config.model_dump() if ledger.config else {}
            snapshot = Snapshot(
                config={"run_id": ledger.run_id, **config},
                state={
                    **marks.state,
                    "elapsed_s": ledger.elapsed_s(),
                    "saved_at": time.time(),
                    "clean_shutdown": clean,
                },
                weights=weights,
                optimizer=optimizer,
                new_episodes=rows,
                new_evaluations=evaluations,
                temporary=dict(params.temporary) if marks.temporary != saved.temporary else {},
                queue_head=marks.queue_head,
                queue=stats.queue_since(saved.queue_end),
            )
            return snapshot, marks

    def _write(self, taken: tuple[Snapshot, _Marks] | None) -> bool:
        if taken is None:
            return False
        snapshot, marks = taken
        self.store.save(snapshot)  # on failure nothing is marked saved: the next save retries
        self._saved = marks
        episodes, evaluations = snapshot.new_episodes, snapshot.new_evaluations
        if episodes or evaluations:
            self.ledger.rows_saved(
                episodes[-1][0] if episodes else None, evaluations[-1][0] if evaluations else None
            )
        return True

    def restored(self) -> None:
        """The ledger and the parameter server were restored from the last save: its FIFO entries
        are on disk (the rest is saved again at the next save, once)."""
        stats = self.ledger.stats
        self._saved = _Marks(
            queue_head=stats.queue_head, queue_end=stats.queue_head + len(stats.queue)
        )
