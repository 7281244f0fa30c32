"""The run folder: one SQLite transaction per save, the users' copies, one owner, archive."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from filelock import FileLock, Timeout

from a3c_http.store import runstore as store
from a3c_http.store.runstore import NonFiniteValue, RunDirInUse, RunStore, Snapshot, atomic_write
from tests.support.store import numbered, numbers_in


@pytest.fixture
def owned(tmp_path: Path):
    s = RunStore.acquire(tmp_path / "run")
    yield s
    s.close()


def test_atomic_write_replaces_or_keeps_the_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "sub" / "weights.safetensors"
    atomic_write(target, b"old")
    atomic_write(target, b"new content")
    assert target.read_bytes() == b"new content"

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(store.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, b"newer")
    monkeypatch.undo()
    assert target.read_bytes() == b"new content"
    assert sorted(p.name for p in target.parent.iterdir()) == ["weights.safetensors"]


def test_a_folder_without_a_run_loads_as_none(tmp_path: Path) -> None:
    assert RunStore(tmp_path / "run").load() is None
    assert RunStore(tmp_path / "run").read_episodes() == []
    assert not (tmp_path / "run").exists(), "reading must not create the folder"


@pytest.mark.parametrize("tables", [(), (1, 2)], ids=["empty-database", "half-a-schema"])
def test_a_master_killed_before_its_first_save_leaves_a_folder_without_a_run(
    tmp_path: Path, tables: tuple[int, ...]
) -> None:
    """A kill while the database is first made leaves it empty or with part of its tables: the
    folder reads as one without a run, and its next owner saves and loads in it."""
    run = tmp_path / "run"
    run.mkdir()
    db = sqlite3.connect(run / store.DB)
    for i in tables:  # meta is the first
        db.execute(store.SCHEMA.split(";")[i])
    db.close()
    assert (run / store.DB).exists()
    assert RunStore(run).load() is None
    assert RunStore(run).saved_meta() == {}
    assert RunStore(run).read_episodes() == []
    owner = RunStore.acquire(run)
    try:
        owner.save(numbered(1))
    finally:
        owner.close()
    assert numbers_in(run) == {1}


def test_a_snapshot_round_trips_and_users_get_copies(owned: RunStore) -> None:
    owned.save(
        Snapshot(
            config={"run_id": "r1", "env_id": "CartPole-v1"},
            state={"run_id": "r1", "stats": {"best_score": 42.0}},
            weights=b"weights-bytes",
            optimizer=b"optimizer-bytes",
            new_episodes=[(1, "w1", 10.0, 10, 1.5), (2, "w2", 20.0, 20, 2.5)],
            temporary={"w:1/a": b"slot"},
            queue_head=3,
            queue=[(3, 0.5), (4, 0.25)],
        )
    )
    snap = RunStore(owned.dir).load()  # a reader beside the owner
    assert snap.config == {"run_id": "r1", "env_id": "CartPole-v1"}
    assert snap.state == {"run_id": "r1", "stats": {"best_score": 42.0}}
    assert (snap.weights, snap.optimizer) == (b"weights-bytes", b"optimizer-bytes")
    assert snap.temporary == {"w:1/a": b"slot"}  # any worker id
    assert (snap.queue_head, snap.queue) == (3, [(3, 0.5), (4, 0.25)])
    assert RunStore(owned.dir).read_episodes() == [
        {"global_episode": 1, "worker_id": "w1", "reward": 10.0, "length": 10, "time": 1.5},
        {"global_episode": 2, "worker_id": "w2", "reward": 20.0, "length": 20, "time": 2.5},
    ]
    assert (owned.dir / "weights.safetensors").read_bytes() == b"weights-bytes"
    assert '"env_id": "CartPole-v1"' in (owned.dir / "config.json").read_text()
    # Anyone can query the history with sqlite3.
    with sqlite3.connect(owned.dir / store.DB) as db:
        assert db.execute("SELECT sum(reward) FROM episodes").fetchone() == (30.0,)


def test_a_save_writes_what_changed_and_a_retried_row_once(owned: RunStore) -> None:
    owned.save(numbered(1, queue=[(0, 1.0), (1, 2.0)]))
    second = numbered(2, queue_head=1, queue=[(2, 3.0)])
    second.weights = second.optimizer = None  # unchanged since the last save
    second.new_episodes = [numbered(1).new_episodes[0], *second.new_episodes]  # a retried row
    owned.save(second)
    snap = owned.load()
    assert (snap.weights, snap.state["n"]) == (b"weights-1", 2)
    assert [r["global_episode"] for r in owned.read_episodes()] == [1, 2]
    assert snap.queue == [(1, 2.0), (2, 3.0)]  # the entry before the head was popped


def test_evaluation_rows_round_trip_and_a_retried_one_is_written_once(owned: RunStore) -> None:
    first = (1, 12, 3.5, 800, 9.5, 0.5, 10, 9.5, 1700000000.0)
    second = (2, 40, 9.25, 2600, 30.0, 4.0, 10, 30.0, 1700000005.0)
    owned.save(Snapshot(config={"run_id": "r1"}, state={"n": 1}, new_evaluations=[first]))
    owned.save(Snapshot(config={"run_id": "r1"}, state={"n": 2}, new_evaluations=[first, second]))
    assert RunStore(owned.dir).read_evaluations() == [
        dict(zip(store.EVALUATION_FIELDS, row, strict=True)) for row in (first, second)
    ]
    # The README's recipe.
    with sqlite3.connect(owned.dir / store.DB) as db:
        query = "SELECT model_version, mean_return FROM evaluations ORDER BY evaluation"
        assert db.execute(query).fetchall() == [(12, 9.5), (40, 30.0)]


def test_a_failed_save_leaves_the_previous_one_whole(owned: RunStore) -> None:
    owned.save(numbered(1))
    broken = numbered(2)
    broken.new_episodes.append((3, "w1", "not a row"))  # fails inside the transaction
    with pytest.raises(sqlite3.Error):
        owned.save(broken)
    assert numbers_in(owned.dir) == {1}
    owned.save(numbered(2))  # and the store goes on
    assert numbers_in(owned.dir) == {2}


def test_a_full_database_fails_the_save_whole_and_the_next_one_writes(owned: RunStore) -> None:
    """SQLite's own "database or disk is full" (max_page_count: the database may not grow): it
    rolls the transaction back by itself, and the store must say so, not that no transaction is
    active, and take the next save once there is room."""
    owned.save(numbered(1))
    db = owned._connect()
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")
    big = numbered(2)
    big.new_episodes += [(n, "w1", 1.0, 1, 1.0) for n in range(3, 400)]
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        owned.save(big)
    assert numbers_in(owned.dir) == {1}
    db.execute("PRAGMA max_page_count = 1000000")
    owned.save(big)
    assert len(owned.read_episodes()) == 399 and owned.load().state["n"] == 2


class CommitRolledBack:
    """A connection whose COMMIT fails as one on a full disk may: SQLite rolled the transaction
    back before it answered."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __getattr__(self, name: str):  # noqa: ANN204 (whatever the connection has)
        return getattr(self._db, name)

    def execute(self, sql: str, *args):  # noqa: ANN002, ANN201
        if sql == "COMMIT":
            self._db.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)


def test_a_commit_rolled_back_by_sqlite_reports_its_own_error(owned: RunStore) -> None:
    owned.save(numbered(1))
    real = owned._connect()
    owned._db = CommitRolledBack(real)
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        owned.save(numbered(2))
    assert not real.in_transaction
    owned._db = real
    owned.save(numbered(2))
    assert numbers_in(owned.dir) == {2}


def test_nothing_nan_or_infinite_is_written(owned: RunStore) -> None:
    owned.save(numbered(1))
    poisoned = numbered(2)
    poisoned.state = {"n": 2, "stats": {"best_score": float("inf")}}
    with pytest.raises(NonFiniteValue, match=r"the state holds stats\.best_score = inf"):
        owned.save(poisoned)
    row = numbered(2)
    row.new_episodes = [(2, "w1", float("nan"), 1, 1.0)]
    with pytest.raises(NonFiniteValue, match="episodes row 2"):
        owned.save(row)
    queue = numbered(2, queue=[(0, float("-inf"))])
    with pytest.raises(NonFiniteValue, match="queue row 0"):
        owned.save(queue)
    assert numbers_in(owned.dir) == {1}
    assert "Infinity" not in (owned.dir / "config.json").read_text()


def test_a_removed_lock_file_lets_no_second_master_in_and_is_put_back(tmp_path: Path) -> None:
    first = RunStore.acquire(tmp_path)
    (tmp_path / store.LOCK).unlink()
    (tmp_path / store.OWNER).unlink()
    with pytest.raises(RunDirInUse, match="in use by another master"):
        RunStore.acquire(tmp_path)  # the folder's own lock (a second open() conflicts too)
    assert first.keep_lock() is True
    assert not first.keep_lock()  # nothing to put back any more
    with pytest.raises(Timeout):  # the lock file is held again, by the owner
        FileLock(str(tmp_path / store.LOCK), timeout=0).acquire()
    with pytest.raises(RunDirInUse, match=rf"\(process {os.getpid()}\)"):
        RunStore.acquire(tmp_path)
    first.save(numbered(1))  # and the owner still writes
    first.close()
    RunStore.acquire(tmp_path).close()


def test_one_master_owns_a_folder(tmp_path: Path) -> None:
    first = RunStore.acquire(tmp_path)
    with pytest.raises(RunDirInUse, match=r"in use by another master \(process \d+\).*A3C_RUN_DIR"):
        RunStore.acquire(tmp_path)
    with pytest.raises(RuntimeError, match="acquired"):
        RunStore(tmp_path).save(numbered(1))  # a reader cannot write
    first.close()
    RunStore.acquire(tmp_path).close()  # free again once the owner is gone


def test_archive_moves_the_run_aside_and_a_new_run_starts_empty(owned: RunStore) -> None:
    owned.save(numbered(1))
    (owned.dir / "rewards.png").write_bytes(b"png")
    target = owned.archive("../../r1")  # a run id cannot lead out of the folder
    assert target.parent == owned.dir / "archive" and target.name.endswith("r1")
    assert sorted(p.name for p in target.iterdir()) == [
        "config.json",
        "rewards.png",
        "run.db",
        "weights.safetensors",
    ]
    assert numbers_in(target) == {1}
    assert owned.load() is None and owned.read_episodes() == []
    owned.save(numbered(5))
    assert [r["global_episode"] for r in owned.read_episodes()] == [5]
