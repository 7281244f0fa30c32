"""The master's state across runs, steps and saves, in-process with a real run folder: what the
HTTP layer adds to these is tested in the test_master_*.py files."""

from __future__ import annotations

import errno
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from a3c_http.algos.base import Sends
from a3c_http.algos.registry import train_config
from a3c_http.config.settings import Settings
from a3c_http.local.cluster import wait_for
from a3c_http.store import runstore as store_module
from a3c_http.store.runstore import RunStore
from a3c_http.wire import tensors as wire
from master.background import housekeeping
from master.state import ClusterState, StateConflict, saved_config
from tests.support.log_capture import CapturedEvents

WORKERS = ["http://127.0.0.1:9"]


CONFIG = train_config(seed=1, max_steps=None)


def settings(tmp_path: Path) -> Settings:
    return Settings(run_dir=tmp_path / "run", workers_file=tmp_path / "workers.txt")


@pytest.fixture
def state(tmp_path: Path) -> Iterator[ClusterState]:
    cluster = ClusterState(settings(tmp_path))
    yield cluster
    cluster.close()


def ones(state: ClusterState) -> bytes:
    """Gradients (or weights) of one small value that fit the current model (as gradients,
    their norm is within max_grad_norm)."""
    spec = state.params.spec
    return wire.encode({name: torch.full(shape, 1e-3) for name, shape in spec.items()})


def test_gradients_of_an_earlier_run_are_refused_however_recent_their_version(
    state: ClusterState,
) -> None:
    state.start_run(CONFIG, WORKERS)
    for version in range(6):
        state.apply_update(Sends.GRADIENTS, "w1", version, ones(state))
    state.finish("stopped")
    state.start_run(CONFIG, WORKERS)
    before = state.params.weights()
    assert before[1] == 7  # well within max_staleness of the first run's versions
    # A late push of the first run that does not name its run (as curl users send them), from
    # an id the new run has too.
    with pytest.raises(StateConflict, match="earlier run"):
        state.apply_update(Sends.GRADIENTS, "w1", 1, ones(state))
    assert state.params.weights() == before
    assert state.status()["updates_rejected"] == 1


def test_weights_of_an_earlier_run_never_replace_the_new_runs(state: ClusterState) -> None:
    best_weights = train_config(CONFIG.model_dump(exclude={"shards"}), algo="best_weights")
    first, _ = state.start_run(best_weights, WORKERS)
    state.finish("stopped")
    state.start_run(CONFIG, WORKERS)
    before = state.params.weights()
    with pytest.raises(StateConflict, match=f"run {first} is over") as refused:
        state.put_weights("w1", ones(state), temporary=False, run_id=first)
    assert refused.value.stop  # the late worker is told to end
    assert state.params.weights() == before


def test_steps_of_episodes_going_on_count_so_max_steps_ends_an_endless_task(
    state: ClusterState,
) -> None:
    state.start_run(CONFIG.model_copy(update={"max_steps": 100}), WORKERS)
    state.report_episode("w1", 1.0, 30)
    assert state.heartbeat("w1", {"env_steps": 50}) is False  # 30 finished, 20 going on
    assert state.status()["env_steps"] == 50
    state.report_episode("w1", 1.0, 25)  # one of those finishes: counted once
    assert (state.status()["global_steps"], state.status()["env_steps"]) == (55, 55)
    assert state.heartbeat("w1", {"env_steps": 120}) is True  # stop: max_steps reached
    status = state.status()
    assert status["state"] == "finished" and status["finish_reason"] == "max_steps=100 reached"
    assert (status["global_steps"], status["env_steps"]) == (55, 120)
    assert RunStore(state.settings.run_dir).load().state["run_state"] == "finished"


def test_the_fifo_is_saved_by_its_changes_and_resumed_in_order(tmp_path: Path) -> None:
    state = ClusterState(settings(tmp_path))
    for value in (1.0, 2.0, 3.0):
        state.ledger.original.push_queue(value)
    state.persist()
    assert state.ledger.original.pop_queue() == 1.0
    state.ledger.original.push_queue(4.0)
    state.persist()
    saved = RunStore(tmp_path / "run").load()
    assert saved.queue == [(1, 2.0), (2, 3.0), (3, 4.0)]  # only the changes were written
    state.close()
    resumed = ClusterState(settings(tmp_path))
    assert [resumed.ledger.original.pop_queue() for _ in range(4)] == [2.0, 3.0, 4.0, None]
    resumed.close()


def test_a_save_taken_first_never_lands_over_a_later_one(
    state: ClusterState, tmp_path: Path
) -> None:
    """The housekeeping thread's save is taken, then a request finishes the run and saves: the
    folder must end with the finished run and every episode, not with the older snapshot."""
    state.start_run(train_config(max_episodes=3, max_steps=None, seed=1), WORKERS)
    state.report_episode("w1", 1.0, 10)

    real_save = state.store.save
    paused, release = threading.Event(), threading.Event()
    calls = 0

    def save_pausing_the_first(snapshot):  # noqa: ANN001 (whatever the store takes)
        nonlocal calls
        calls += 1
        if calls == 1:
            paused.set()
            release.wait(10)
        return real_save(snapshot)

    state.store.save = save_pausing_the_first
    housekeeping = threading.Thread(target=state.persist)
    housekeeping.start()
    assert paused.wait(10), "the first save never started"

    def finish_the_run() -> None:
        state.report_episode("w1", 2.0, 10)
        state.report_episode("w1", 3.0, 10)  # max_episodes: finishes and saves

    request = threading.Thread(target=finish_the_run)
    request.start()
    # While the first save is held, the later one must wait for it (it may not overtake it).
    request.join(timeout=0.2)  # ample: a save that overtook would take ms
    release.set()
    housekeeping.join(10)
    request.join(10)
    assert not housekeeping.is_alive() and not request.is_alive()
    assert state.status()["state"] == "finished"

    saved = RunStore(tmp_path / "run").load()
    assert saved is not None
    assert saved.state["run_state"] == "finished"
    assert saved.state["stats"]["global_episode"] == 3
    rows = RunStore(tmp_path / "run").read_episodes()
    assert [(r["global_episode"], r["reward"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_a_config_saved_before_the_learner_fields_resumes_as_it_was_saved() -> None:
    old = train_config(env_id="Acrobot-v1", preset=None).model_dump()
    for field in (
        "preset",
        "shared_torso",
        "optimizer",
        "normalize_obs",
        "normalize_reward",
        "wire_dtype",
    ):
        del old[field]  # what an earlier version's config.json did not hold
    config = saved_config({**old, "run_id": "r1"})
    assert config.shared_torso and config.optimizer == "adam" and config.preset is None
    assert config.wire_dtype == "float32"
    assert not config.normalize_obs  # Acrobot-v1's preset does not creep in
    fresh = train_config(env_id="Acrobot-v1").resolved()
    assert saved_config(fresh.model_dump()) == fresh  # today's saves read back unchanged


# -- saving through faults --------------------------------------------------------------------


def disk_full(state: ClusterState, full: bool = True) -> None:
    """The run folder's database may not grow (or may again): SQLite then answers "database or
    disk is full" as on a full disk (PRAGMA max_page_count, on the store's own connection)."""
    db = state.store._connect()
    pages = db.execute("PRAGMA page_count").fetchone()[0] if full else 1_000_000
    db.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_disk_loses_nothing_in_memory_and_saving_resumes_by_itself(
    state: ClusterState,
) -> None:
    """Every part changes while saves fail: episode rows, the FIFO, an evaluation, the temporary
    slots, the weights, and the finish (whose own save fails without raising into the request).
    Once there is room, the next save writes all of it."""
    state.start_run(CONFIG.model_copy(update={"max_episodes": 300}), WORKERS)
    state.put_weights("w1", ones(state), temporary=True)
    state.worker_started("w2", None)  # a second worker joins: its slot changes too
    state.persist()
    disk_full(state)
    for i in range(299):
        state.report_episode("w1", float(i), 10)
    state.apply_update(Sends.GRADIENTS, "w1", 0, ones(state))
    state.put_weights("w2", ones(state), temporary=True)
    taken = {"model_version": 1, "elapsed_s": 1.0, "global_steps": 10}
    result = {"mean_return": 3.0, "std_return": 1.0, "episodes": 2, "mean_length": 9.0}
    state.record_evaluation(state.ledger.run_id, taken, result, None)
    assert state.report_episode("w1", 1.0, 10)["stop"]  # the 300th finishes the run
    status = state.status()
    assert status["state"] == "finished"
    assert status["save_error"]["failures"] == 1, status["save_error"]
    assert "database or disk is full" in status["save_error"]["error"]
    folder = RunStore(state.settings.run_dir)
    assert folder.load().state["run_state"] == "running" and folder.read_episodes() == []

    disk_full(state, False)
    assert state.persist() is True
    assert state.status()["save_error"] is None
    saved = folder.load()
    assert saved.state["run_state"] == "finished"
    assert [r["global_episode"] for r in folder.read_episodes()] == list(range(1, 301))
    assert saved.queue == state.ledger.stats.queue_since(0) and len(saved.queue) == 300
    assert [e["mean_return"] for e in folder.read_evaluations()] == [3.0]
    assert set(saved.temporary) == {"w1", "w2"}
    assert (saved.weights, saved.state["model_version"]) == state.params.weights()
    assert (state.settings.run_dir / "weights.safetensors").read_bytes() == saved.weights


def test_a_users_copy_that_fails_leaves_no_temp_file_and_the_next_save_writes_it(
    state: ClusterState, monkeypatch: pytest.MonkeyPatch
) -> None:
    state.start_run(CONFIG, WORKERS)
    state.apply_update(Sends.GRADIENTS, "w1", 0, ones(state))

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module.os, "fsync", no_space)
    state.persist()  # the transaction lands; the copy of the weights does not
    monkeypatch.undo()
    assert "No space left on device" in state.status()["save_error"]["error"]
    run_dir = state.settings.run_dir
    assert [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")] == []
    assert state.persist() is True
    assert (run_dir / "weights.safetensors").read_bytes() == state.params.weights()[0]


def test_weights_or_an_optimizer_state_holding_nan_are_never_saved(state: ClusterState) -> None:
    state.start_run(CONFIG, WORKERS)
    state.apply_update(Sends.GRADIENTS, "w1", 0, ones(state))
    state.persist()
    before = RunStore(state.settings.run_dir).load()
    net = state.params.net
    name = net.layout.names[0]
    finite = net.flat.clone()
    net.flat[net.layout.slices[name]] = float("nan")
    state.params.version += 1  # as an update would
    state.persist()
    assert f"tensor {name!r} of the weights holds NaN" in state.status()["save_error"]["error"]
    net.flat.copy_(finite)
    entry = next(iter(net.optimizer.state.values()))
    key = next(k for k, v in entry.items() if torch.is_tensor(v) and v.dim() > 0)
    entry[key][0] = float("inf")
    state.persist()
    assert f"the optimizer's {key} holds NaN" in state.status()["save_error"]["error"]
    after = RunStore(state.settings.run_dir).load()
    assert (after.weights, after.optimizer) == (before.weights, before.optimizer)


def test_housekeeping_survives_failing_chores_and_saves_at_a_later_tick(
    tmp_path: Path, captured_events: CapturedEvents
) -> None:
    state = ClusterState(settings(tmp_path).model_copy(update={"persist_interval_s": 0.05}))
    state.start_run(CONFIG, WORKERS)
    failing = {"liveness": 2, "save": 2}
    real_check, real_save = state.check_liveness, state.store.save

    def check_liveness() -> None:
        if failing["liveness"]:
            failing["liveness"] -= 1
            raise RuntimeError("liveness broke")
        real_check()

    def save(snapshot) -> None:  # noqa: ANN001 (whatever the store takes)
        if failing["save"]:
            failing["save"] -= 1
            raise sqlite3.OperationalError("database or disk is full")
        real_save(snapshot)

    state.check_liveness, state.store.save = check_liveness, save
    state.report_episode("w1", 5.0, 10)
    (tmp_path / "run" / store_module.LOCK).unlink()  # a hand tidies the folder
    stop = threading.Event()
    thread = threading.Thread(target=housekeeping.run, args=(state, stop, ()))
    thread.start()
    saved = RunStore(tmp_path / "run")
    try:
        wait_for(
            lambda: len(saved.read_episodes()) == 1 and not any(failing.values()),
            10,
            "a save after the failed ones",
        )
        wait_for(lambda: (tmp_path / "run" / store_module.LOCK).exists(), 10, "the lock file")
    finally:
        stop.set()
        thread.join(10)
        state.close()
    assert not thread.is_alive()
    failed = captured_events.all("save_failed")  # the repeat is at DEBUG, below the level
    assert [r.levelname for r in failed] == ["ERROR"]
    assert "database or disk is full" in failed[0].fields["error"]
    assert captured_events.one("save_recovered").fields["failures"] == 2
    chore = captured_events.one("housekeeping_failed")
    assert chore.fields["chore"] == "liveness" and chore.exc_info  # with its traceback
    assert captured_events.one("housekeeping_recovered").fields["chore"] == "liveness"
    assert captured_events.one("lock_file_restored").levelname == "WARNING"
