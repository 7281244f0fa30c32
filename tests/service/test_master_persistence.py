"""The master's persistence: a new master on the same run folder resumes the run as it was,
and one resumed after a crash never reuses a model version. In-process (TestClient and
ClusterState)."""

from __future__ import annotations

import io
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from a3c_http.algos.base import Sends
from a3c_http.algos.registry import train_config
from a3c_http.store.runstore import RunStore
from a3c_http.wire import tensors as wire
from master import state as state_module
from master.state import (
    VERSIONS_SKIPPED_AFTER_A_CRASH,
    ClusterState,
    StateConflict,
    versions_to_skip,
)
from tests.support.log_capture import CapturedEvents
from tests.support.master_api import (
    TRAIN,
    episode,
    gradients_like,
    make_settings,
    master,
    push_gradients,
    start_run,
    status,
    weights,
)
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import launched as launched


def test_a_new_master_resumes_the_run(tmp_path: Path, launched: list) -> None:
    settings = make_settings(tmp_path)
    with master(settings) as c:
        start_run(c)
        c.post("/worker_started", json={"worker_id": "w1", "url": "http://127.0.0.1:9001"})
        for reward, length in ((10.0, 12), (30.0, 25), (20.0, 9)):
            episode(c, reward, length)
        tensors, version, _ = weights(c)
        assert push_gradients(c, wire.encode(gradients_like(tensors)), version).status_code == 200
        c.get("/queue")  # pop the oldest, so the FIFO no longer matches the episodes
        before = status(c)
        _, before_version, before_body = weights(c)
    assert before_version == 1

    with master(settings) as c:
        after = status(c)
        for key in (
            "state",
            "run_id",
            "env_id",
            "global_episode",
            "global_steps",
            "best_score",
            "moving_average",
            "mean_return_100",
            "model_version",
            "updates_applied",
            "updates_rejected",
            "queue_length",
            "queue_dropped",
            "config",
        ):
            assert after[key] == before[key], key
        assert after["state"] == "running"
        assert after["elapsed_s"] >= before["elapsed_s"]
        assert {
            w["worker_id"]: (w["state"], w["episodes"], w["steps"]) for w in after["workers"]
        } == {w["worker_id"]: (w["state"], w["episodes"], w["steps"]) for w in before["workers"]}
        _, version, body = weights(c)
        assert version == before_version
        assert body == before_body
        avg1 = 0.99 * 10.0 + 0.01 * 30.0
        avg2 = 0.99 * avg1 + 0.01 * 20.0
        assert c.get("/queue").json()["data"] == pytest.approx(avg1)
        assert c.get("/queue").json()["data"] == pytest.approx(avg2)
        assert c.get("/queue").json() == {"data": None, "empty": True}
        # The resumed run goes on: counters and versions continue from where they were.
        assert episode(c, 5.0)["global_episode"] == 4
        tensors = st_load(body)
        r = push_gradients(c, wire.encode(gradients_like(tensors)), version)
        assert r.status_code == 200
        assert r.headers["X-Model-Version"] == str(version + 1)


def test_a_master_resumed_after_a_crash_never_reuses_a_version(tmp_path: Path) -> None:
    """Versions handed out after the last save of a crashed master named weights that are lost:
    the resumed master skips past them (and saves that at once), so no version or ETag a worker
    holds from before the crash can name other weights. A clean shutdown skips nothing.
    (`close()` without a save is the crash: the process's end gives up the folder.)"""
    settings = make_settings(tmp_path)
    crashed = ClusterState(settings)
    crashed.start_run(train_config(seed=1), ["http://127.0.0.1:9"])
    params = crashed.params
    grads = wire.encode(gradients_like(wire.decode(params.weights()[0], params.spec)))
    crashed.apply_update(Sends.GRADIENTS, "w1", 0, grads)
    crashed.persist()  # a periodic save; then more versions, lost with the crash
    saved, _ = params.weights()
    saved_at = RunStore(settings.run_dir).load().state["saved_at"]
    for version in (1, 2):
        crashed.apply_update(Sends.GRADIENTS, "w1", version, grads)
    assert params.version == 3
    crashed.close()

    before = time.time()
    resumed = ClusterState(settings)
    after = time.time()
    jump = resumed.params.version - 1
    assert versions_to_skip(saved_at, before) <= jump <= versions_to_skip(saved_at, after)
    assert jump >= VERSIONS_SKIPPED_AFTER_A_CRASH
    assert resumed.params.weights() == (saved, resumed.params.version)  # the saved weights
    with pytest.raises(StateConflict, match="versions old"):
        resumed.apply_update(Sends.GRADIENTS, "w1", 3, grads)  # computed on lost weights: refused
    resumed.close()
    # Crashing again right away skips again from the save the resumed master made at once.
    again = ClusterState(settings)
    assert again.params.version >= resumed.params.version + VERSIONS_SKIPPED_AFTER_A_CRASH
    again.persist(force=True, clean=True)
    again.close()
    assert ClusterState(settings).params.version == again.params.version


def test_the_jump_passes_versions_handed_out_while_saves_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A master resumed on a full disk cannot save its jump, hands out versions above it and
    crashes too: the next resume, from the same last save, jumps past them as well, since the
    jump grows with the time since that save (a second here, far more than it applied in it).
    After a long outage the jump is as long as the versions a master could apply meanwhile."""
    settings = make_settings(tmp_path)
    clock = [0.0]
    monkeypatch.setattr(state_module, "time", SimpleNamespace(time=lambda: clock[0]))
    first = ClusterState(settings)
    first.start_run(train_config(seed=1), ["http://127.0.0.1:9"])
    first.close()  # a crash after the save of the run's start
    saved_at = RunStore(settings.run_dir).load().state["saved_at"]

    def disk_full(self: RunStore, snapshot: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(RunStore, "save", disk_full)
    clock[0] = saved_at + 2.0
    resumed = ClusterState(settings)
    assert resumed.status()["save_error"]["failures"] == 1  # its jump is not on disk
    params = resumed.params
    grads = wire.encode(gradients_like(wire.decode(params.weights()[0], params.spec)))
    for _ in range(5):
        resumed.apply_update(Sends.GRADIENTS, "w1", params.version, grads)
    handed_out = params.version
    resumed.close()  # and a crash
    clock[0] += 1.0
    again = ClusterState(settings)
    assert again.params.version > handed_out
    again.close()
    assert versions_to_skip(saved_at, saved_at + 3600) >= 3600 * 100_000


def test_status_and_metrics_show_a_failing_save_until_one_succeeds(
    tmp_path: Path, launched: list
) -> None:
    with master(make_settings(tmp_path)) as c:
        start_run(c)
        register(c)
        state = c.app.state.cluster
        saved_at = status(c)["last_saved_at"]
        assert status(c)["save_error"] is None and saved_at > 0
        real = state.store.save

        def disk_full(snapshot: object) -> None:
            raise sqlite3.OperationalError("database or disk is full")

        state.store.save = disk_full
        episode(c, 1.0)
        started = time.time()
        state.persist()
        assert c.post("/stop", json={}).json()["data"]["stopped"]  # its save fails: no 500
        failing = status(c)
        assert failing["save_error"]["error"] == "OperationalError: database or disk is full"
        assert failing["save_error"]["failures"] == 2
        assert saved_at <= failing["save_error"]["since"] <= started + 1
        assert failing["last_saved_at"] == saved_at
        assert metric(c, "a3c_save_failures") == 2
        assert metric(c, "a3c_last_save_timestamp_seconds") == pytest.approx(saved_at)
        state.store.save = real
        state.persist()
        assert status(c)["save_error"] is None and metric(c, "a3c_save_failures") == 0
        assert status(c)["last_saved_at"] > saved_at
    assert RunStore(tmp_path / "run").load().state["run_state"] == "finished"


def register(c: TestClient, worker_id: str = "w1") -> None:
    r = c.post("/worker_started", json={"worker_id": worker_id, "url": "http://127.0.0.1:9001"})
    assert r.status_code == 200, r.text


def metric(c: TestClient, name: str) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def test_no_new_run_begins_while_the_last_ones_changes_cannot_be_saved(
    tmp_path: Path, launched: list
) -> None:
    """Archiving a run whose last changes are not on disk would lose them: POST /train says why
    (503) and changes nothing, and begins once they are saved."""
    with master(make_settings(tmp_path)) as c:
        first = start_run(c)["run_id"]
        register(c)
        state = c.app.state.cluster
        real = state.store.save

        def disk_full(snapshot: object) -> None:
            raise sqlite3.OperationalError("database or disk is full")

        state.store.save = disk_full
        episode(c, 7.0)
        c.post("/stop", json={})
        r = c.post("/train", json=TRAIN)
        assert r.status_code == 503, r.text
        assert "database or disk is full" in r.json()["detail"]
        assert "POST /train again" in r.json()["detail"]
        assert (status(c)["run_id"], status(c)["state"]) == (first, "finished")
        assert not (tmp_path / "run" / "archive").exists()
        state.store.save = real
        assert start_run(c)["run_id"] != first
    archived = RunStore(tmp_path / "run" / "archive" / first)
    assert archived.load().state["run_state"] == "finished"
    assert [r["reward"] for r in archived.read_episodes()] == [7.0]


# -- a run that cannot be resumed -------------------------------------------------------------


def saved_run(tmp_path: Path) -> tuple[str, int]:
    """A run folder holding a run with weights, an optimizer state and an episode: its run id
    and model version."""
    with master(make_settings(tmp_path)) as c:
        run_id = start_run(c)["run_id"]
        register(c)
        tensors, version, _ = weights(c)
        assert push_gradients(c, wire.encode(gradients_like(tensors)), version).status_code == 200
        episode(c, 3.0)
        return run_id, status(c)["model_version"]


def files(folder: Path) -> dict[str, bytes]:
    """Every file of a folder but its owner's lock files, by relative path."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in (".a3c.lock", ".a3c.owner")
    }


def poison_weights(db: sqlite3.Connection) -> None:
    blob = db.execute("SELECT data FROM blobs WHERE name = 'weights'").fetchone()[0]
    tensors = st_load(blob)
    next(iter(tensors.values()))[0] = float("nan")
    db.execute("UPDATE blobs SET data = ? WHERE name = 'weights'", (st_save(tensors),))


def poison_optimizer(db: sqlite3.Connection) -> None:
    blob = db.execute("SELECT data FROM blobs WHERE name = 'optimizer'").fetchone()[0]
    state = torch.load(io.BytesIO(blob), weights_only=True)
    entry = next(iter(state["state"].values()))
    next(v for v in entry.values() if v.dim() > 0)[0] = float("inf")
    buf = io.BytesIO()
    torch.save(state, buf)
    db.execute("UPDATE blobs SET data = ? WHERE name = 'optimizer'", (buf.getvalue(),))


# How a folder is spoiled, what the master then says, and whether it still reads the run's id and
# its last model version there.
POISONS = {
    "weights holding NaN": (poison_weights, "holds NaN or infinite values", True, True),
    "an optimizer state holding inf": (
        poison_optimizer,
        "of the optimizer state (table blobs, 'optimizer') holds NaN or infinite values",
        True,
        True,
    ),
    "a config that no longer validates": (
        lambda db: db.execute(
            "UPDATE meta SET value = json_set(value, '$.env_id', 'NoSuchEnv-v9') "
            "WHERE key = 'config'"
        ),
        "its config no longer validates: env_id 'NoSuchEnv-v9': unknown gymnasium environment",
        True,
        True,
    ),
    "a state that does not parse": (
        lambda db: db.execute("UPDATE meta SET value = '{\"run_id\": ' WHERE key = 'state'"),
        "its saved state does not parse",
        True,
        False,
    ),
    "a missing table": (
        lambda db: db.execute("DROP TABLE temporary"),
        "SQLite cannot read it (no such table: temporary)",
        True,
        True,
    ),
    "a run.db that is not a database": (
        None,
        "SQLite cannot read it (file is not a database)",
        False,
        False,
    ),
}


@pytest.mark.parametrize("poison", POISONS)
def test_a_run_that_cannot_be_resumed_is_left_as_it_is_until_a_new_run_archives_it(
    tmp_path: Path, launched: list, poison: str, captured_events: CapturedEvents
) -> None:
    run_id, version = saved_run(tmp_path)
    folder = tmp_path / "run"
    change, problem, id_known, version_known = POISONS[poison]
    if change is None:
        (folder / "run.db").write_bytes(b"not a database " * 100)
    else:
        with sqlite3.connect(folder / "run.db") as db:
            change(db)
        db.close()
    before = files(folder)

    with master(make_settings(tmp_path)) as c:  # starts, idle, and says why
        s = status(c)
        error = s["resume_error"]
        assert s["state"] == "idle" and s["run_id"] is None, s
        assert error["run_id"] == (run_id if id_known else None)
        assert error["file"] == str(folder / "run.db") and problem in error["error"]
        assert error["error"].startswith(f"{folder / 'run.db'} ")
        moved = f"run {run_id} is" if id_known else "its files are"
        assert f"POST /train to start a new run; {moved} then moved to {error['archive_to']}/" in (
            error["error"]
        )
        assert c.get("/history").json()["episodes"] == []
        c.app.state.cluster.persist(force=True)
    assert captured_events.one("resume_failed").getMessage() == error["error"]
    assert files(folder) == before  # nothing written, by a tick or by the shutdown

    with master(make_settings(tmp_path)) as c:
        start_run(c)
        s = status(c)
        assert s["state"] == "running" and s["resume_error"] is None
        # Versions go on after the old run's, when its last one can be read.
        assert s["model_version"] > version if version_known else s["model_version"] == 0
    archived = Path(error["archive_to"])
    assert archived.parent == folder / "archive"
    assert (archived.name == run_id) if id_known else archived.name.startswith("unresumable-")
    assert files(archived) == {name: data for name, data in before.items() if "/" not in name}


def test_a_run_of_an_env_module_no_longer_allowed_resumes_once_it_is_allowed_again(
    tmp_path: Path, launched: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A3C_ENV_MODULES", "tests.support.envs")
    with master(make_settings(tmp_path)) as c:
        run_id = start_run(c, env_id="tests.support.envs:Payout-v0")["run_id"]
    monkeypatch.delenv("A3C_ENV_MODULES")
    with master(make_settings(tmp_path)) as c:
        error = status(c)["resume_error"]["error"]
    assert (
        f"holds run {run_id}, which cannot be resumed: its config no longer validates: env_id "
        "'tests.support.envs:Payout-v0': module 'tests.support.envs' is not in A3C_ENV_MODULES"
    ) in error
    advice = "Set A3C_ENV_MODULES=tests.support.envs on the master and every worker and restart"
    assert advice in error
    assert f"run {run_id} is then moved to {tmp_path / 'run' / 'archive' / run_id}/" in error
    monkeypatch.setenv("A3C_ENV_MODULES", "tests.support.envs")
    with master(make_settings(tmp_path)) as c:
        s = status(c)
        assert (s["run_id"], s["state"], s["resume_error"]) == (run_id, "running", None)
