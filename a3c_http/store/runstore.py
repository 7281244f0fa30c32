"""The run folder (`A3C_RUN_DIR`): what a master persists, and what it resumes from.

    run.db                SQLite, the source of truth: the run's config and state, the global
                          weights, the optimizer state, the temporary weight slots, the episode
                          and evaluation history and the moving-average FIFO
    weights.safetensors   a copy of the global weights for users, rewritten after a save that
                          changed them
    config.json           a copy of the resolved config, for users
    archive/<run_id>/     earlier runs of this folder, moved aside by a new POST /train
    .a3c.lock, .a3c.owner the one master that owns the folder (a3c_http/store/folderlock.py)

A save is one SQLite transaction, so a kill at any moment leaves the previous save or the new one,
never a mix of the two (new weights with old counters). Episode rows are keyed by their global
episode number and FIFO entries by their position, so a save retried after a failure writes each
row once. Any user can read a run with `sqlite3 run.db 'select * from episodes'`.

A save that fails (a full disk) leaves the previous save whole and the store ready for the next
one; nothing NaN or infinite is ever written (`NonFiniteValue`), so a folder never holds a value
that its master could not resume from.

Only one master may own a folder at a time: `RunStore.acquire` takes its locks for the life of
the process (`.a3c.lock` and a flock on the folder itself, which no hand can delete), and a second
master (or `uvicorn --workers 2`) refuses to start. Reading a folder (`RunStore(path)`: plots,
evaluation, tests) needs no lock.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a3c_http.store.folderlock import LOCK, OWNER, FolderLock, RunDirInUse

__all__ = ["LOCK", "OWNER", "NonFiniteValue", "RunDirInUse", "RunStore", "Snapshot", "atomic_write"]

DB = "run.db"
# What a new run moves to archive/<run_id>/ (the quickstart's plot included).
RUN_FILES = (DB, "weights.safetensors", "config.json")
EPISODE_FIELDS = ("global_episode", "worker_id", "reward", "length", "time")
# One row per evaluation of the global weights (master/background/evaluator.py), keyed by its number
# from 1: the weights' version, the run's elapsed seconds and env steps when they were taken, the
# result.
EVALUATION_FIELDS = (
    "evaluation",
    "model_version",
    "elapsed_s",
    "global_steps",
    "mean_return",
    "std_return",
    "episodes",
    "mean_length",
    "time",
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (name TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS temporary (worker_id TEXT PRIMARY KEY, weights BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS episodes (
    global_episode INTEGER PRIMARY KEY,
    worker_id TEXT NOT NULL,
    reward REAL NOT NULL,
    length INTEGER NOT NULL,
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS queue (position INTEGER PRIMARY KEY, value REAL NOT NULL);
CREATE TABLE IF NOT EXISTS evaluations (
    evaluation INTEGER PRIMARY KEY,
    model_version INTEGER NOT NULL,
    elapsed_s REAL NOT NULL,
    global_steps INTEGER NOT NULL,
    mean_return REAL NOT NULL,
    std_return REAL NOT NULL,
    episodes INTEGER NOT NULL,
    mean_length REAL NOT NULL,
    time REAL NOT NULL
);
"""


class NonFiniteValue(ValueError):
    """A value about to be saved is NaN or infinite: the save is refused (the folder keeps its
    last save), since a master could never resume from it."""


def find_non_finite(obj: Any, path: str = "") -> str | None:
    """Where in a JSON-like `obj` the first NaN or infinity is (`stats.best_score = inf`), or
    None when every number is finite."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else f"{path or 'the value'} = {obj}"
    if isinstance(obj, dict):
        items: Any = obj.items()
    elif isinstance(obj, list | tuple):
        items = enumerate(obj)
    else:
        return None
    for key, value in items:
        found = find_non_finite(value, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


@dataclass
class Snapshot:
    """One consistent picture of the master's state, taken under its locks. `weights` and
    `optimizer` are None when they did not change since the last save (nothing is written);
    `queue_head` is the position of the FIFO's oldest entry, `queue` the entries from there."""

    config: dict[str, Any]
    state: dict[str, Any]
    weights: bytes | None = None
    optimizer: bytes | None = None
    target: bytes | None = None  # a value-based run's target network (float32 weights)
    new_episodes: list[tuple] = field(default_factory=list)
    new_evaluations: list[tuple] = field(default_factory=list)
    temporary: dict[str, bytes] = field(default_factory=dict)
    queue_head: int = 0
    queue: list[tuple[int, float]] = field(default_factory=list)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old or the new content, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _safe_name(run_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:100].lstrip(".") or "_"


def _json(obj: Any, what: str = "the value") -> str:
    """`obj` as the run folder's JSON; NonFiniteValue for a NaN or an infinity, which JSON does
    not have (Python would write `Infinity`, which no strict reader takes)."""
    try:
        return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False)
    except ValueError:
        raise NonFiniteValue(f"{what} holds {find_non_finite(obj)}: not saved") from None


def _check_rows(table: str, rows: list[tuple]) -> None:
    for row in rows:
        bad = find_non_finite(list(row))
        if bad is not None:
            raise NonFiniteValue(f"{table} row {row[0]} holds a NaN or infinity: not saved")


class RunStore:
    """A run folder. `RunStore(path)` reads it; `RunStore.acquire(path)` owns it and writes."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir)
        self._db: sqlite3.Connection | None = None
        self._lock: FolderLock | None = None  # held by the owner (`acquire`)
        self._config_copy: bytes | None = None  # what config.json holds, once this store wrote it

    @classmethod
    def acquire(cls, run_dir: Path) -> RunStore:
        """The store of the master that owns `run_dir`; RunDirInUse when another one does."""
        store = cls(run_dir)
        store.dir.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(store.dir)
        lock.take()
        store._lock = lock
        return store

    def keep_lock(self) -> bool:
        """The owner puts back a lock file removed by hand (a3c_http/store/folderlock.py); True when
        it did."""
        return self._lock.keep() if self._lock is not None else False

    def close(self) -> None:
        """Close the database and give up the folder (no save: the caller saves first)."""
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def path(self, name: str) -> Path:
        return self.dir / name

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            # Saves come from the housekeeping thread and from request threads; the master
            # serialises them (master/persistence/saver.py), so one connection may serve them all.
            db = sqlite3.connect(self.path(DB), check_same_thread=False, isolation_level=None)
            try:
                db.execute("PRAGMA synchronous=FULL")
                db.executescript(SCHEMA)
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def save(self, snap: Snapshot) -> None:
        """Write one snapshot in one transaction, then refresh the users' copies. On failure
        (sqlite3.Error, OSError, NonFiniteValue) the folder keeps its previous save and the store
        takes the next one; a copy that failed is written again by the next save that holds it."""
        if self._lock is None:
            raise RuntimeError("only the master that acquired the run folder writes to it")
        config = _json(snap.config, "the config")
        state = _json(snap.state, "the state")
        for table, rows in (
            ("episodes", snap.new_episodes),
            ("evaluations", snap.new_evaluations),
            ("queue", snap.queue),
        ):
            _check_rows(table, rows)
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", [("config", config), ("state", state)]
            )
            blobs = {"weights": snap.weights, "optimizer": snap.optimizer, "target": snap.target}
            db.executemany(
                "INSERT OR REPLACE INTO blobs VALUES (?, ?)",
                [(n, b) for n, b in blobs.items() if b],
            )
            db.executemany("INSERT OR REPLACE INTO temporary VALUES (?, ?)", snap.temporary.items())
            db.executemany(
                "INSERT OR IGNORE INTO episodes VALUES (?, ?, ?, ?, ?)", snap.new_episodes
            )
            db.executemany(
                "INSERT OR IGNORE INTO evaluations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                snap.new_evaluations,
            )
            db.execute("DELETE FROM queue WHERE position < ?", (snap.queue_head,))
            db.executemany("INSERT OR IGNORE INTO queue VALUES (?, ?)", snap.queue)
            db.execute("COMMIT")
        except BaseException:
            self._roll_back(db)
            raise
        if snap.weights:
            atomic_write(self.path("weights.safetensors"), snap.weights)
        config_copy = config.encode()
        if config_copy != self._config_copy:
            atomic_write(self.path("config.json"), config_copy)
            self._config_copy = config_copy

    def _roll_back(self, db: sqlite3.Connection) -> None:
        """End the failed transaction, if SQLite did not: at some errors (a full disk among them)
        it rolls back by itself, and a ROLLBACK then fails ("no transaction is active") over the
        error that says what went wrong."""
        if not db.in_transaction:
            return
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            # A connection that cannot even roll back is given up: the next save opens another,
            # and SQLite rolls the journal of this transaction back when it does.
            with contextlib.suppress(sqlite3.Error):
                db.close()
            self._db = None

    def _read(self) -> sqlite3.Connection | None:
        """The database to read, or None where the folder holds no run: no database, or one
        without the `meta` table (a master killed while it first made its tables, before its
        first save)."""
        if self._db is not None:
            return self._db
        if not self.path(DB).exists():
            return None
        # Read-write but never created: a reader rolls back the journal of a killed save.
        db = sqlite3.connect(f"file:{self.path(DB)}?mode=rw", uri=True)
        try:
            made = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone()
        except BaseException:
            db.close()
            raise
        if made is None:
            db.close()
            return None
        return db

    def load(self) -> Snapshot | None:
        """The last saved state, or None for a folder that holds no run."""
        db = self._read()
        if db is None:
            return None
        try:
            meta = dict(db.execute("SELECT key, value FROM meta"))
            if "state" not in meta:
                return None
            blobs = dict(db.execute("SELECT name, data FROM blobs"))
            queue = list(db.execute("SELECT position, value FROM queue ORDER BY position"))
            return Snapshot(
                config=json.loads(meta["config"]),
                state=json.loads(meta["state"]),
                weights=blobs.get("weights"),
                optimizer=blobs.get("optimizer"),
                target=blobs.get("target"),
                temporary=dict(db.execute("SELECT worker_id, weights FROM temporary")),
                queue_head=queue[0][0] if queue else 0,
                queue=queue,
            )
        finally:
            if db is not self._db:
                db.close()

    def read_episodes(self, after: int = 0, limit: int = -1) -> list[dict[str, Any]]:
        """The episode history as dicts, in episode order (plots, evaluation, tests): the episodes
        numbered above `after`, at most `limit` of them (-1: all)."""
        return self._rows("episodes", EPISODE_FIELDS, after, limit)

    def read_evaluations(self, after: int = 0, limit: int = -1) -> list[dict[str, Any]]:
        """The evaluations of the run's global weights as dicts, in order (as read_episodes)."""
        return self._rows("evaluations", EVALUATION_FIELDS, after, limit)

    def _rows(
        self, table: str, fields: tuple[str, ...], after: int, limit: int
    ) -> list[dict[str, Any]]:
        db = self._read()
        if db is None:
            return []
        try:
            rows = db.execute(
                f"SELECT {', '.join(fields)} FROM {table} WHERE {fields[0]} > ? ORDER BY 1 LIMIT ?",
                (after, limit),
            )
            return [dict(zip(fields, row, strict=True)) for row in rows]
        except sqlite3.OperationalError:  # never saved yet, or saved before the table existed
            return []
        finally:
            if db is not self._db:
                db.close()

    def saved_meta(self) -> dict[str, str]:
        """The texts of the `meta` table (the config and the state) as saved, unparsed: for a
        folder whose run does not load (master/persistence/resume.py). Raises what reading it
        raises."""
        db = self._read()
        if db is None:
            return {}
        try:
            return dict(db.execute("SELECT key, value FROM meta"))
        finally:
            if db is not self._db:
                db.close()

    def archive_path(self, run_id: str) -> Path:
        """Where `archive` moves the files of run `run_id`."""
        return self.path("archive") / _safe_name(run_id)

    def archive(self, run_id: str) -> Path | None:
        """Move the files of the run in this folder to archive/<run_id>/ (a new run begins)."""
        if self._db is not None:
            self._db.close()
            self._db = None
        self._config_copy = None
        present = [self.path(name) for name in RUN_FILES if self.path(name).exists()]
        present += sorted(self.dir.glob("*.png"))
        if not present:
            return None
        target = self.archive_path(run_id)
        target.mkdir(parents=True, exist_ok=True)
        for path in present:
            shutil.move(str(path), target / path.name)
        return target
