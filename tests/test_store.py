"""The run folder: atomic writes, snapshot round trip, episode history trimming, archive."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from a3c_http import store
from a3c_http.localcluster import ROOT
from a3c_http.store import EPISODE_FIELDS, RunStore, Snapshot, atomic_write

HEADER = ",".join(EPISODE_FIELDS)


def snapshot(global_episode: int, rows: list[tuple] | None = None, **kw) -> Snapshot:
    return Snapshot(
        config={"run_id": "r1", "env_id": "CartPole-v1", "lr": 0.001},
        state={"run_id": "r1", "global_episode": global_episode, "best_score": 42.0},
        weights=b"weights-bytes",
        optimizer=b"optimizer-bytes",
        new_episodes=rows or [],
        **kw,
    )


def rows(first: int, last: int) -> list[tuple]:
    return [
        (i, f"w{i % 2 + 1}", float(10 * i), 10 * i, 1700000000.0 + i)
        for i in range(first, last + 1)
    ]


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


# -- atomic_write ---------------------------------------------------------------------------------


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "state.json"
    atomic_write(target, b"old")
    assert target.read_bytes() == b"old"
    atomic_write(target, b"new content")
    assert target.read_bytes() == b"new content"
    assert temp_files(tmp_path) == []
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]


def test_atomic_write_failure_keeps_old_content_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "weights.safetensors"
    atomic_write(target, b"old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(store.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert temp_files(tmp_path) == []


# -- save / load ----------------------------------------------------------------------------------


def test_load_of_an_empty_folder_is_none(tmp_path: Path) -> None:
    assert RunStore(tmp_path / "run").load() is None
    assert RunStore(tmp_path / "run").read_episodes() == []


def test_snapshot_round_trip(tmp_path: Path) -> None:
    rs = RunStore(tmp_path / "run")
    snap = snapshot(3, rows(1, 3), temporary={"w1": b"tmp-1", "w2": b"tmp-2"})
    rs.save(snap)
    loaded = RunStore(tmp_path / "run").load()
    assert loaded is not None
    assert loaded.config == snap.config
    assert loaded.state == snap.state
    assert loaded.weights == b"weights-bytes"
    assert loaded.optimizer == b"optimizer-bytes"
    assert loaded.temporary == {"w1": b"tmp-1", "w2": b"tmp-2"}
    assert loaded.new_episodes == []  # the history is on disk, not pending
    assert json.loads((tmp_path / "run" / "state.json").read_text()) == snap.state
    assert temp_files(tmp_path) == []


def test_later_saves_append_episodes(tmp_path: Path) -> None:
    rs = RunStore(tmp_path)
    rs.save(snapshot(2, rows(1, 2)))
    rs.save(snapshot(2))  # nothing new
    rs.save(snapshot(4, rows(3, 4)))
    lines = (tmp_path / "episodes.csv").read_text().splitlines()
    assert lines[0] == HEADER
    assert len(lines) == 5
    assert [e["global_episode"] for e in rs.read_episodes()] == [1, 2, 3, 4]


def test_read_episodes_parses_rows(tmp_path: Path) -> None:
    rs = RunStore(tmp_path)
    rs.save(snapshot(2, [(1, "w1", 12.5, 12, 1700000000.25), (2, "host:8002", -3.0, 7, 1.5)]))
    assert rs.read_episodes() == [
        {"global_episode": 1, "worker_id": "w1", "reward": 12.5, "length": 12,
         "time": 1700000000.25},
        {"global_episode": 2, "worker_id": "host:8002", "reward": -3.0, "length": 7, "time": 1.5},
    ]


def test_torn_last_line_is_dropped_on_load(tmp_path: Path) -> None:
    rs = RunStore(tmp_path)
    rs.save(snapshot(3, rows(1, 3)))
    path = tmp_path / "episodes.csv"
    with path.open("a", newline="") as f:
        f.write("4,w1,40.0,4")  # a kill in the middle of an append
    assert len(rs.read_episodes()) == 3  # readers skip it already
    assert rs.load() is not None
    assert "4,w1,40.0,4" not in path.read_text()
    assert path.read_text().splitlines()[0] == HEADER
    assert [e["global_episode"] for e in rs.read_episodes()] == [1, 2, 3]
    # The next append starts on a line of its own.
    rs.save(snapshot(4, rows(4, 4)))
    assert [e["global_episode"] for e in rs.read_episodes()] == [1, 2, 3, 4]
    assert rs.read_episodes()[-1]["reward"] == 40.0


def test_rows_newer_than_state_are_dropped_on_load(tmp_path: Path) -> None:
    rs = RunStore(tmp_path)
    rs.save(snapshot(2, rows(1, 2)))
    path = tmp_path / "episodes.csv"
    # Rows appended, then the process died before state.json said global_episode = 4.
    with path.open("a", newline="") as f:
        f.write("3,w1,30.0,30,1.0\r\n4,w2,40.0,40,2.0\r\n")
    assert len(rs.read_episodes()) == 4
    loaded = rs.load()
    assert loaded is not None and loaded.state["global_episode"] == 2
    assert [e["global_episode"] for e in rs.read_episodes()] == [1, 2]
    text = path.read_text()
    assert "30.0" not in text and "40.0" not in text
    assert temp_files(tmp_path) == []


def test_load_leaves_a_consistent_history_untouched(tmp_path: Path) -> None:
    rs = RunStore(tmp_path)
    rs.save(snapshot(2, rows(1, 2)))
    path = tmp_path / "episodes.csv"
    before = path.read_bytes()
    mtime = path.stat().st_mtime_ns
    rs.load()
    assert path.read_bytes() == before
    assert path.stat().st_mtime_ns == mtime


def test_archive_moves_run_files(tmp_path: Path) -> None:
    rs = RunStore(tmp_path)
    rs.save(snapshot(2, rows(1, 2), temporary={"w1": b"t"}))
    (tmp_path / "rewards.png").write_bytes(b"png")
    (tmp_path / "notes.txt").write_text("keep me")
    target = rs.archive("run-1")
    assert target == tmp_path / "archive" / "run-1"
    for name in ("config.json", "state.json", "weights.safetensors", "optimizer.pt",
                 "episodes.csv", "rewards.png"):
        assert (target / name).exists(), name
        assert not (tmp_path / name).exists(), name
    assert RunStore(target)._load_temporary() == {"w1": b"t"}
    assert not (tmp_path / "temporary").exists()
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    assert json.loads((target / "state.json").read_text())["global_episode"] == 2
    # The folder now holds no run; archiving again has nothing to move.
    assert rs.load() is None
    assert rs.read_episodes() == []
    assert rs.archive("run-2") is None
    assert not (tmp_path / "archive" / "run-2").exists()


def test_archive_then_new_run_starts_a_fresh_history(tmp_path: Path) -> None:
    rs = RunStore(tmp_path)
    rs.save(snapshot(2, rows(1, 2)))
    rs.archive("old")
    rs.save(snapshot(1, rows(1, 1)))
    assert [e["global_episode"] for e in rs.read_episodes()] == [1]
    old = RunStore(tmp_path / "archive" / "old")
    assert [e["global_episode"] for e in old.read_episodes()] == [1, 2]


def test_archive_run_id_cannot_escape_the_folder(tmp_path: Path) -> None:
    rs = RunStore(tmp_path / "run")
    rs.save(snapshot(0))
    target = rs.archive("../../evil")
    assert target is not None
    assert target.resolve().is_relative_to((tmp_path / "run" / "archive").resolve())
    assert os.path.isdir(target)


def test_temporary_slots_keep_their_worker_ids(tmp_path: Path) -> None:
    # Both ids match the master's WorkerId pattern ^[A-Za-z0-9._:@/-]+$.
    temporary = {"10.0.0.2:8001": b"first", "10.0.0.2/8001": b"second"}
    rs = RunStore(tmp_path)
    rs.save(snapshot(0, temporary=temporary))
    loaded = rs.load()
    assert loaded is not None
    assert loaded.temporary == temporary


def test_a_periodic_save_rewrites_only_what_changed(tmp_path: Path) -> None:
    rs = RunStore(tmp_path)
    rs.save(snapshot(1, temporary={"w1": b"slot-a", "w2": b"slot-b"}))
    inode = {name: (tmp_path / name).stat().st_ino
             for name in ("config.json", "weights.safetensors", "state.json")}
    slots = {p.name: p.stat().st_ino for p in (tmp_path / "temporary").iterdir()}

    changed = snapshot(2, temporary={"w1": b"slot-a", "w2": b"slot-c"})
    changed.weights = b"new-weights"
    rs.save(changed)
    assert (tmp_path / "config.json").stat().st_ino == inode["config.json"]  # unchanged
    assert (tmp_path / "weights.safetensors").stat().st_ino != inode["weights.safetensors"]
    assert (tmp_path / "state.json").stat().st_ino != inode["state.json"]
    after = {p.name: p.stat().st_ino for p in (tmp_path / "temporary").iterdir()}
    assert sum(after[n] != slots[n] for n in slots) == 1  # only w2's slot was rewritten
    loaded = RunStore(tmp_path).load()
    assert loaded.weights == b"new-weights"
    assert loaded.temporary == {"w1": b"slot-a", "w2": b"slot-c"}


# -- a save is all or nothing ---------------------------------------------------------------------


def numbered(n: int) -> Snapshot:
    """A snapshot whose every file says `n`, so a mix of two saves is visible."""
    return Snapshot(
        config={"run_id": "r1"},
        state={"run_id": "r1", "global_episode": n, "n": n},
        weights=f"weights-{n};".encode() * 1000,
        optimizer=f"optimizer-{n};".encode() * 1000,
        new_episodes=rows(n, n),
        temporary={"w1": f"slot-{n};".encode()},
    )


def number(data: bytes) -> int:
    return int(data.split(b";")[0].split(b"-")[1])


def numbers_in(folder: Path) -> set[int]:
    loaded = RunStore(folder).load()
    assert loaded is not None
    found = {
        loaded.state["n"],
        number(loaded.weights),
        number(loaded.optimizer),
        number(loaded.temporary["w1"]),
    }
    episodes = RunStore(folder).read_episodes()
    assert [e["global_episode"] for e in episodes] == list(range(1, loaded.state["n"] + 1))
    return found


def test_a_save_cut_before_its_commit_is_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = RunStore(tmp_path)
    s.save(numbered(1))
    real = store.atomic_write

    def crash_at_commit(path: Path, data: bytes) -> None:
        if path.name == store.COMMIT:
            raise KeyboardInterrupt("killed")
        real(path, data)

    monkeypatch.setattr(store, "atomic_write", crash_at_commit)
    with pytest.raises(KeyboardInterrupt):
        s.save(numbered(2))
    monkeypatch.setattr(store, "atomic_write", real)
    assert list(tmp_path.rglob("*.pending"))  # the cut save left its staged files
    assert numbers_in(tmp_path) == {1}
    assert not list(tmp_path.rglob("*.pending"))


def test_a_save_cut_after_its_commit_is_rolled_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = RunStore(tmp_path)
    s.save(numbered(1))
    real = os.replace
    moved: list[str] = []

    def crash_after_one_replace(src, dst) -> None:
        if str(src).endswith(".pending") and moved:
            raise KeyboardInterrupt("killed")
        moved.append(str(dst))
        real(src, dst)

    monkeypatch.setattr(os, "replace", crash_after_one_replace)
    with pytest.raises(KeyboardInterrupt):
        s.save(numbered(2))
    monkeypatch.setattr(os, "replace", real)
    assert (tmp_path / store.COMMIT).exists()
    assert numbers_in(tmp_path) == {2}
    assert not (tmp_path / store.COMMIT).exists()


KILL_LOOP = """
import sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from tests.test_store import numbered
from a3c_http.store import RunStore
s = RunStore(Path(sys.argv[1]))
loaded = s.load()
n = loaded.state["n"] if loaded else 0
print("ready", flush=True)
while True:
    n += 1
    s.save(numbered(n))
"""


def test_kill_9_in_the_middle_of_saves_leaves_one_whole_snapshot(tmp_path: Path) -> None:
    """SIGKILL a process that saves snapshots as fast as it can, at seeded random moments, again
    and again: every time, what is on disk loads as one whole snapshot."""
    rng = random.Random(3)
    seen: list[int] = []
    for _ in range(12):
        proc = subprocess.Popen(
            [sys.executable, "-c", KILL_LOOP, str(tmp_path), str(ROOT)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.0, 0.08))  # a random moment to kill at, not a synchronisation
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc.stdout.close()
        if RunStore(tmp_path).load() is None:
            assert not seen, "a saved snapshot disappeared"
            continue  # killed before its first save was committed
        found = numbers_in(tmp_path)
        assert len(found) == 1, f"a mix of snapshots {found}"
        seen.append(found.pop())
    assert seen == sorted(seen) and seen[-1] > seen[0], seen  # it saved, and never went back


def test_rows_of_a_failed_save_appended_again_are_kept_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = RunStore(tmp_path)
    s.save(snapshot(2, rows(1, 2)))
    real = store.atomic_write

    def full_disk_at_commit(path: Path, data: bytes) -> None:
        if path.name == store.COMMIT:
            raise OSError("no space left on device")
        real(path, data)

    monkeypatch.setattr(store, "atomic_write", full_disk_at_commit)
    with pytest.raises(OSError):
        s.save(snapshot(4, rows(3, 4)))  # the rows are on disk, the state is not
    monkeypatch.setattr(store, "atomic_write", real)
    s.save(snapshot(5, rows(3, 5)))  # the master queues the rows again with the next ones
    assert [r["global_episode"] for r in s.read_episodes()] == [1, 2, 3, 4, 5]
    RunStore(tmp_path).load()
    assert (tmp_path / "episodes.csv").read_text().count("\n") == 6  # header and 5 rows
