"""Snapshots for the run folder's tests: each part of snapshot `n` carries `n`, so a loaded
snapshot is whole when every part gives the same number."""

from __future__ import annotations

from pathlib import Path

from a3c_http.store.runstore import RunStore, Snapshot


def numbered(n: int, **kw) -> Snapshot:
    """A snapshot whose every part says `n`, so a mix of two saves shows."""
    return Snapshot(
        config={"run_id": "r1", "n": n},
        state={"run_id": "r1", "n": n},
        weights=f"weights-{n}".encode(),
        optimizer=f"optimizer-{n}".encode(),
        new_episodes=[(n, "w1", float(n), n, 1700000000.0 + n)],
        **kw,
    )


def numbers_in(folder: Path) -> set[int]:
    """The numbers of every part of the saved snapshot: one number when it is whole."""
    snap = RunStore(folder).load()
    assert snap is not None
    return {
        snap.config["n"],
        snap.state["n"],
        int(snap.weights.decode().split("-")[1]),
        int(snap.optimizer.decode().split("-")[1]),
        max(r["global_episode"] for r in RunStore(folder).read_episodes()),
    }
