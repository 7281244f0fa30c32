"""The worker registry of one run: each worker's record, when it was last heard from, and whether
it is still taking part. It has no lock of its own: the run ledger (master/run/ledger.py) holds its
lock around every call, and tells it whether the run is running. Each change of a worker's state
is an event of the run's log (master/run/events.py)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from a3c_http.algos.exploration import derive
from a3c_http.algos.registry import algorithm_class
from a3c_http.config.training import TrainConfig
from master.errors import NotRegistered, StateConflict
from master.run.events import RunEvents
from master.run.records import ACTIVE, WorkerRecord

# The most workers one run's registry holds (A3C_MAX_WORKERS): 20,000 registrations of fresh ids
# once made /status 43 MB and kept an idle master at a quarter of a core.
DEFAULT_MAX_WORKERS = 1024


class Registry:
    def __init__(
        self,
        events: RunEvents,
        records: dict[str, WorkerRecord] | None = None,
        max_workers: int = DEFAULT_MAX_WORKERS,
    ) -> None:
        self.events = events
        self.records = records or {}
        self.max_workers = max_workers

    @classmethod
    def launching(
        cls, worker_urls: list[str], config: TrainConfig, events: RunEvents, max_workers: int
    ) -> Registry:
        """The workers the master is about to start, `w1`, `w2`, ... in the order of the URLs,
        each with the exploration settings of its place in that order."""
        now = time.time()
        return cls(
            events,
            {
                f"w{i}": WorkerRecord(
                    f"w{i}",
                    url,
                    "starting",
                    now,
                    launching=True,
                    exploration=derive(config, i - 1, algorithm_class(config)).model_dump(),
                    stats_at=now,
                    origin="launched",
                )
                for i, url in enumerate(worker_urls, start=1)
            },
            max_workers,
        )

    def get(self, worker_id: str) -> WorkerRecord | None:
        return self.records.get(worker_id)

    def require(self, worker_id: str) -> WorkerRecord:
        """The record of a registered worker; NotRegistered for an id the registry does not
        hold."""
        record = self.records.get(worker_id)
        if record is None:
            raise NotRegistered(
                f"worker {worker_id!r} is not registered in this run: a worker registers with "
                "POST /worker_started (a worker the master starts is registered by POST /train)",
                stop=True,
            )
        return record

    def touch(self, worker_id: str, running: bool, url: str | None = None) -> WorkerRecord:
        """Note that a registered worker was heard from (NotRegistered for another id). Only a
        running run brings a worker (back) to `running`; after the end a late message must not
        make the run look busy again."""
        record = self.require(worker_id)
        record.last_seen = time.time()
        if url:
            record.url = url
        if record.state in ("starting", "lost") and running:
            if record.state == "lost":
                self.events.worker_back(record)
            record.state = "running"
        return record

    def register(self, worker_id: str, url: str | None, running: bool) -> None:
        """An explicit registration (POST /worker_started): the worker runs, in any state. A new
        id needs room in the registry (`max_workers`)."""
        was = self.records[worker_id].state if worker_id in self.records else None
        if was is None:
            if len(self.records) >= self.max_workers:
                raise StateConflict(
                    f"this run's registry is full: it holds {len(self.records)} workers "
                    "(A3C_MAX_WORKERS on the master), so no new worker id can join"
                )
            now = time.time()
            self.records[worker_id] = WorkerRecord(worker_id, url, "running", now, stats_at=now)
        record = self.touch(worker_id, running, url)
        record.state = "running"
        record.error = None
        if was not in ("running", "lost"):  # a lost one said it came back already
            self.events.worker_joined(record)

    def join(
        self, config: TrainConfig, name: str, url: str | None, worker_id: str | None
    ) -> WorkerRecord:
        """A worker that joins by itself (POST /join): back under `worker_id` if this run holds
        it (it joined before the master restarted, or before its own trainer gave up), else under
        the next free id `wN`, with the exploration settings of its place N - 1 in the run."""
        record = self.records.get(worker_id) if worker_id else None
        if record is None:
            if len(self.records) >= self.max_workers:
                raise StateConflict(
                    f"this run's registry is full: it holds {len(self.records)} workers "
                    "(A3C_MAX_WORKERS on the master), so no new worker can join"
                )
            number = len(self.records) + 1
            while f"w{number}" in self.records:
                number += 1
            now = time.time()
            record = WorkerRecord(
                f"w{number}",
                url,
                "starting",
                now,
                exploration=derive(config, number - 1, algorithm_class(config)).model_dump(),
                stats_at=now,
                origin="joined",
                name=name,
            )
            self.records[record.worker_id] = record
        # `starting` until its first message: its POST /worker_started logs it as joined.
        record.error = None
        record.name, record.url = name, url or record.url
        record.state, record.last_seen = "starting", time.time()
        return record

    def end(self, worker_id: str, error: str | None, running: bool) -> str:
        """The worker said it is done, or failed with `error`; returns its new state."""
        record = self.touch(worker_id, running)
        state = "failed" if error else "done"
        if (record.state, record.error) != (state, error):  # not a retry of the same news
            record.state, record.error = state, error
            self.events.worker_ended(record)
        return state

    def mark_failed(self, worker_id: str, error: str) -> None:
        """The master could not start it."""
        record = self.records.get(worker_id)
        if record is not None:
            record.state = "failed"
            record.error = error
            record.launching = False
            self.events.worker_ended(record)

    def mark_silent_lost(self, config: TrainConfig) -> None:
        """Mark workers silent past the heartbeat timeout (or, before their first message, the
        start timeout) as lost. A worker still being launched is not judged yet."""
        now = time.time()
        for record in self.records.values():
            if record.state not in ACTIVE or record.launching:
                continue
            name = "heartbeat_timeout_s"
            if record.state == "starting" and config.start_timeout_s is not None:
                name = "start_timeout_s"
            limit = getattr(config, name)
            if now - record.last_seen > limit:
                record.state = "lost"
                record.error = f"no message for {now - record.last_seen:.1f} s ({name}={limit})"
                self.events.worker_lost(record)

    def active(self) -> int:
        return sum(r.state in ACTIVE for r in self.records.values())

    def running(self) -> set[str]:
        return {r.worker_id for r in self.records.values() if r.state == "running"}

    def steps_in_progress(self) -> int:
        return sum(r.steps_in_progress() for r in self.records.values())

    def public(self) -> list[dict[str, Any]]:
        now = time.time()
        return [r.public(now) for r in self.records.values()]

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.records.values()]

    @classmethod
    def from_json(
        cls, data: list[dict[str, Any]], events: RunEvents, max_workers: int
    ) -> Registry:
        """The registry of a resumed run: every active worker gets a full timeout to come back
        (and its env steps count from now)."""
        now = time.time()
        records = {}
        for item in data:
            record = WorkerRecord(**item)
            record.launching = False  # a launch does not survive the process that made it
            record.stats_at = now
            if record.state in ACTIVE:
                record.last_seen = now
            records[record.worker_id] = record
        return cls(events, records, max_workers)
