"""Persistence: one path from the master's state to its run folder.

One mutex covers taking a snapshot, writing it and archiving a run, so saves land in the order
they were taken: a snapshot taken first can never be written over a later one. The snapshot is
taken under the ledger's and the parameter server's locks (in that order, see master/state.py) and
written after they are released, so no request ever waits for the disk; only another save does.

Nothing marks the state "dirty": a save compares what it would write with what it last wrote and
writes only when something changed (the weights by their version, the rest by value), and only
what changed (new episode and evaluation rows and FIFO entries, weights of a new version).

A save that fails (a full disk, a NaN that must not be written) changes nothing in memory: what it
would have written is still there, marked unsaved, and the next save writes it with whatever
changed since. So `save` never raises: it records the failure (`failures`: /status's
`save_error`, /metrics) and logs it (master/run/events.py `Failures`), and the housekeeping thread's
next tick retries. Only a new run is refused (`FolderUnwritable`) while the previous run's last
changes cannot be saved: moving that run to archive/ unsaved would lose them.

The folder may hold files of no run in memory: a run the master could not resume (`unresumable`,
master/persistence/resume.py), which nothing writes into until a new run moves it aside, or the
previous run, when moving it aside failed (`_aside`): the next save moves it first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from a3c_http.store.runstore import NonFiniteValue, RunStore, Snapshot
from master.learning.parameter_server import ParameterServer
from master.run.events import Failures
from master.run.ledger import RunLedger

T = TypeVar("T")


@dataclass(frozen=True)
class _Marks:
    """What a snapshot holds, to tell the next save what is on disk already."""

    state: dict[str, Any] | None = None
    version: int | None = None
    temporary: int = -1
    queue_head: int = 0
    queue_end: int = 0


class FolderUnwritable(Exception):
    """A new run cannot begin: the previous run's last changes cannot be saved (the message says
    why and what to do)."""


class Persister:
    def __init__(self, store: RunStore, ledger: RunLedger, params: ParameterServer) -> None:
        self.store = store
        self.ledger = ledger
        self.params = params
        self.mutex = threading.Lock()
        self._saved = _Marks()
        self.failures = Failures("saving the run folder", "save")
        self.last_saved_at: float | None = None  # unix time of the last save written
        self.unresumable: str | None = None  # its name under archive/, while it is here
        self._aside: str | None = None  # the previous run's, until its files are moved aside

    @property
    def holds_current_run(self) -> bool:
        """Whether the folder's files are those of the run in memory (or of none yet)."""
        return self.unresumable is None and self._aside is None

    def save(self, force: bool = False, clean: bool = False, wait_s: float = -1) -> bool:
        """Write the state to the run folder if anything changed (or `force`); True when it did.
        `clean`: this is the last save of a process that shuts down, so nothing happens after it.
        `wait_s`: how long to wait for a save in progress (-1: as long as it takes). A failure is
        recorded and logged, never raised: the next save retries it."""
        if not self.mutex.acquire(timeout=wait_s):
            waited = TimeoutError(f"a save in progress did not end within {wait_s} s")
            self.failures.failed(waited, self.ledger.run_id)
            return False
        try:
            return self._save(force, clean)
        finally:
            self.mutex.release()

    def _save(self, force: bool, clean: bool) -> bool:
        if self.unresumable is not None:
            return False
        try:
            written = self._settle(force, clean)
        except Exception as exc:  # whatever it is, the thread that saves goes on
            self.failures.failed(exc, self.ledger.run_id)
            return False
        self.failures.succeeded(self.ledger.run_id)
        return written

    def _settle(self, force: bool, clean: bool) -> bool:
        """Under the mutex: move the previous run's files aside if they are still here, then
        write what changed. Raises what the store raises."""
        if self._aside is not None:
            self.store.archive(self._aside)
            self._aside = None
            self._saved = _Marks()  # the folder holds nothing of the current run yet
        return self._write(self._take(force, clean))

    def switch_run(self, swap: Callable[[], T]) -> T:
        """Start a new run: `swap()` (called under both locks) replaces the old run's state by the
        new one's. The old run's changes are saved first (FolderUnwritable, nothing swapped, when
        they cannot be), then its files (or those of a run that could not be resumed) go to
        archive/ and the new run is saved, all before any other save can land; a failure of
        these is recorded and retried by the next save. Returns what `swap` returns."""
        with self.mutex:
            old_run_id = self.ledger.run_id if self.unresumable is None else None
            if old_run_id is not None:
                try:
                    self._settle(force=False, clean=False)
                except NonFiniteValue as exc:  # it can never be saved: the last save is the run
                    self.failures.failed(exc, old_run_id)
                except Exception as exc:
                    self.failures.failed(exc, old_run_id)
                    raise FolderUnwritable(
                        f"run {old_run_id}'s last changes cannot be saved "
                        f"({type(exc).__name__}: {exc}), and archiving the run without them "
                        "would lose them: free space in the run folder (or fix what the error "
                        "names) and POST /train again"
                    ) from exc
            with self.ledger.lock, self.params.lock:
                try:  # the changes of the instant since
                    last = self._take(force=False, clean=False) if old_run_id else None
                except NonFiniteValue:
                    last = None
                result = swap()
            self._aside, self.unresumable = self.unresumable or old_run_id, None
            if last is not None:
                try:
                    self._write(last)
                except Exception as exc:  # the archived run then ends at the save before
                    self.failures.failed(exc, old_run_id)
            self._save(force=True, clean=False)
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
            weights, optimizer, target = (
                params.blobs() if marks.version not in (None, saved.version) else (None, None, None)
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
                target=target,
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
        self.last_saved_at = snapshot.state["saved_at"]
        episodes, evaluations = snapshot.new_episodes, snapshot.new_evaluations
        if episodes or evaluations:
            self.ledger.rows_saved(
                episodes[-1][0] if episodes else None, evaluations[-1][0] if evaluations else None
            )
        return True

    def restored(self, saved_at: float | None) -> None:
        """The ledger and the parameter server were restored from the save made at `saved_at`:
        its FIFO entries are on disk (the rest is saved again at the next save, once)."""
        stats = self.ledger.stats
        self._saved = _Marks(
            queue_head=stats.queue_head, queue_end=stats.queue_head + len(stats.queue)
        )
        self.last_saved_at = saved_at
