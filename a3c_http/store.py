"""The run folder (`A3C_RUN_DIR`): what a master persists, and what it resumes from.

    config.json              the resolved TrainConfig and the run id
    state.json               counters, best score, moving average, last-100 window, FIFO, registry
    weights.safetensors      the global weights (the model version in its metadata)
    optimizer.pt             the master optimizer's state (written and read only by the master)
    episodes.csv             one row per episode: global_episode, worker_id, reward, length, time
    temporary/               each worker's temporary weights slot (index.json: file -> worker)
    archive/<run_id>/        earlier runs of this folder, moved aside by a new POST /train

A save is all or nothing, so a kill at any moment leaves the previous snapshot or the new one,
never a torn file nor a mix of the two (new weights with old counters):

1. every changed file is written to `<name>.pending`, fsynced;
2. `commit.json`, the list of those files, is written atomically: the snapshot is now committed;
3. each `<name>.pending` is renamed over `<name>`, then `commit.json` is removed.

A load that finds `commit.json` finishes step 3 first (roll forward); pending files without it are
an unfinished save and are deleted (roll back). `episodes.csv` is appended before the commit; a
torn last line, rows newer than `state.json`, or rows appended again after a failed save are
dropped on load so the history always matches the counters. All of it happens under a filelock,
so two processes never interleave.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

EPISODE_FIELDS = ("global_episode", "worker_id", "reward", "length", "time")
RUN_FILES = (
    "config.json",
    "state.json",
    "weights.safetensors",
    "optimizer.pt",
    "episodes.csv",
    "temporary",
)
COMMIT = "commit.json"
PENDING = ".pending"


@dataclass
class Snapshot:
    """One consistent picture of the master's state, taken under its locks."""

    config: dict[str, Any]
    state: dict[str, Any]
    weights: bytes
    optimizer: bytes
    new_episodes: list[tuple] = field(default_factory=list)
    temporary: dict[str, bytes] = field(default_factory=dict)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    _fsync_dir(path.parent)


def _pending(path: Path) -> Path:
    return path.with_name(path.name + PENDING)


def _slot_file(worker_id: str) -> str:
    return hashlib.sha256(worker_id.encode()).hexdigest()[:24] + ".safetensors"


def _safe_name(worker_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", worker_id)[:100].lstrip(".") or "_"


class RunStore:
    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.dir / ".a3c.lock"), timeout=30)
        # Digest of what this store last wrote to each path: a periodic save skips the files that
        # did not change (config.json, idle temporary slots), sparing their fsyncs.
        self._written: dict[Path, bytes] = {}

    def path(self, name: str) -> Path:
        return self.dir / name

    def _stage(self, staged: dict[Path, bytes], path: Path, data: bytes) -> None:
        """Write `data` to `<path>.pending` unless `path` already holds exactly these bytes."""
        digest = hashlib.sha256(data).digest()
        if self._written.get(path) == digest and path.exists():
            return
        pending = _pending(path)
        pending.parent.mkdir(parents=True, exist_ok=True)
        with pending.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        staged[path] = digest

    def save(self, snap: Snapshot) -> None:
        with self._lock:
            staged: dict[Path, bytes] = {}
            self._stage(staged, self.path("config.json"), _json_bytes(snap.config))
            if snap.weights:  # an idle master has counters but no network yet
                self._stage(staged, self.path("weights.safetensors"), snap.weights)
                self._stage(staged, self.path("optimizer.pt"), snap.optimizer)
            if snap.temporary:
                self._stage_temporary(staged, snap.temporary)
            self._stage(staged, self.path("state.json"), _json_bytes(snap.state))
            # The rows go first: state.json, once committed, says how far the history goes.
            if snap.new_episodes:
                self._append_episodes(snap.new_episodes)
            for folder in {path.parent for path in staged}:
                _fsync_dir(folder)
            names = [str(path.relative_to(self.dir)) for path in staged]
            atomic_write(self.path(COMMIT), _json_bytes(names))  # the commit point
            self._apply_commit(names)
            for path, digest in staged.items():
                self._written[path] = digest

    def _apply_commit(self, names: list[str]) -> None:
        """Step 3: move the committed pending files into place (idempotent), drop the record."""
        for name in names:
            path = self.dir / name
            if _pending(path).exists():
                os.replace(_pending(path), path)
        for folder in {(self.dir / name).parent for name in names}:
            _fsync_dir(folder)
        self.path(COMMIT).unlink(missing_ok=True)
        _fsync_dir(self.dir)

    def _recover(self) -> None:
        """Finish a committed save, or throw away an unfinished one (see the module docstring)."""
        commit = self.path(COMMIT)
        if commit.exists():
            self._apply_commit(json.loads(commit.read_text()))
        for stray in self.dir.rglob("*" + PENDING):
            stray.unlink(missing_ok=True)

    def _stage_temporary(self, staged: dict[Path, bytes], slots: dict[str, bytes]) -> None:
        # File names come from a hash (worker ids may hold ':' or '/'); index.json maps them back.
        folder = self.path("temporary")
        index = {_slot_file(worker_id): worker_id for worker_id in slots}
        for name, worker_id in index.items():
            self._stage(staged, folder / name, slots[worker_id])
        self._stage(staged, folder / "index.json", _json_bytes(index))

    def _load_temporary(self) -> dict[str, bytes]:
        index_path = self.path("temporary") / "index.json"
        if not index_path.exists():
            return {}
        index = json.loads(index_path.read_text())
        folder = self.path("temporary")
        return {
            wid: (folder / name).read_bytes()
            for name, wid in index.items()
            if (folder / name).exists()
        }

    def _append_episodes(self, rows: list[tuple]) -> None:
        path = self.path("episodes.csv")
        new_file = not path.exists() or path.stat().st_size == 0
        with path.open("a", newline="") as f:
            writer = csv.writer(f)
            if new_file:
                writer.writerow(EPISODE_FIELDS)
            writer.writerows(rows)
            f.flush()
            os.fsync(f.fileno())

    def load(self) -> Snapshot | None:
        """The last persisted state, or None for a folder that holds no run."""
        with self._lock:
            self._recover()
            if not self.path("state.json").exists():
                return None
            state = json.loads(self.path("state.json").read_text())
            config = json.loads(self.path("config.json").read_text())
            weights = _read_or_empty(self.path("weights.safetensors"))
            optimizer = _read_or_empty(self.path("optimizer.pt"))
            temporary = self._load_temporary()
            self._trim_episodes(int(state.get("global_episode", 0)))
        return Snapshot(config, state, weights, optimizer, [], temporary)

    def _trim_episodes(self, last_episode: int) -> None:
        """Drop a torn last line and rows that state.json does not count yet."""
        path = self.path("episodes.csv")
        if not path.exists():
            return
        raw = path.read_text()
        kept, dropped = self._parse_rows(raw, last_episode)
        if dropped:
            out = io.StringIO()
            writer = csv.writer(out)
            writer.writerow(EPISODE_FIELDS)
            writer.writerows(kept)
            atomic_write(path, out.getvalue().encode())

    @staticmethod
    def _parse_rows(raw: str, last_episode: int | None) -> tuple[list[list[str]], int]:
        kept: list[list[str]] = []
        dropped = 0
        lines = raw.splitlines(keepends=True)
        for i, line in enumerate(lines):
            if i == 0 and line.startswith(EPISODE_FIELDS[0]):
                continue
            row = next(csv.reader([line]), [])
            complete = line.endswith("\n") and len(row) == len(EPISODE_FIELDS)
            try:
                episode = int(row[0]) if complete else None
                float(row[2]) if complete else None
            except ValueError:
                episode = None
            if (
                episode is None
                or (last_episode is not None and episode > last_episode)
                or (kept and episode <= int(kept[-1][0]))  # appended again after a failed save
            ):
                dropped += 1
                continue
            kept.append(row)
        return kept, dropped

    def read_episodes(self) -> list[dict[str, Any]]:
        """The episode history as dicts (for plots and tests)."""
        path = self.path("episodes.csv")
        if not path.exists():
            return []
        rows, _ = self._parse_rows(path.read_text(), None)
        return [
            {
                "global_episode": int(r[0]),
                "worker_id": r[1],
                "reward": float(r[2]),
                "length": int(r[3]),
                "time": float(r[4]),
            }
            for r in rows
        ]

    def archive(self, run_id: str) -> Path | None:
        """Move the files of the run in this folder to archive/<run_id>/ (a new run begins)."""
        with self._lock:
            present = [name for name in RUN_FILES if self.path(name).exists()]
            if not present:
                return None
            target = self.path("archive") / _safe_name(run_id)
            target.mkdir(parents=True, exist_ok=True)
            for name in present:
                os.replace(self.path(name), target / name)
            self._written.clear()
            for extra in self.dir.glob("*.png"):
                shutil.move(str(extra), target / extra.name)
            _fsync_dir(self.dir)
            return target


def _read_or_empty(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
