"""The master's scalars in Weights & Biases, in W&B's offline mode (no server, no account): what
the offline run wrote is read back from its record log (tests/support/wandb_records.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from a3c_http.config.settings import Settings
from a3c_http.local.cluster import wait_for
from master.app import create_app
from master.persistence.scalars import Figures
from tests.support.charted_run import charted_run, push, tensorboard_scalars
from tests.support.common import master_running

pytest.importorskip("wandb", reason="the `wandb` extra is not installed")
pytest.importorskip("tensorboard", reason="the `tensorboard` extra is not installed")
import wandb  # noqa: E402

from master.persistence.tensorboard import TensorBoard  # noqa: E402
from master.persistence.wandb_sink import STEP, WandB  # noqa: E402
from tests.support.log_capture import CapturedEvents  # noqa: E402
from tests.support.wandb_records import OfflineRun, read_run, run_file  # noqa: E402

PROJECT = "a3c-test"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """W&B offline and silent, its own files under tmp_path, nothing of the user's W&B set-up.
    wandb reads its variables once per process (`wandb.setup`): torn down around each test, it
    reads this test's."""
    for name in ("WANDB_DIR", "WANDB_CONSOLE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID",
                 "WANDB_RESUME", "WANDB_API_KEY", "A3C_WANDB_PROJECT"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    wandb.teardown()
    yield
    wandb.teardown()


def written(folder: Path, run_id: str) -> OfflineRun:
    """What W&B wrote of run `run_id` under `folder` (whose `wandb/` holds the runs): read once
    wandb is torn down, since its service writes the record log after `finish` returns."""
    wandb.teardown()
    return read_run(run_file(folder, run_id))


def test_wandb_gets_the_scalars_tensorboard_gets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    run_dir = tmp_path / "board"
    run_id, config = charted_run(tmp_path, [TensorBoard(run_dir), WandB(run_dir, PROJECT)])
    board = tensorboard_scalars(run_dir / "tensorboard" / run_id)
    run = written(tmp_path / "wandb-dir", run_id)
    # The same names, steps and values (TensorBoard keeps 32-bit floats, W&B 64-bit ones).
    logged = run.scalars(STEP)
    assert sorted(logged) == sorted(board) and "eval/mean_reward" in logged
    for name, points in board.items():
        assert logged[name] == [(step, pytest.approx(value)) for step, value in points], name
    assert logged["rollout/ep_rew_mean"] == [(40, 15.0), (80, 20.0)]
    assert logged["eval/mean_reward"] == [(60, 42.0)]  # before 80: a row of its own
    # One W&B run for the run: its id, name and config; finished when the run ended.
    assert (run.run_id, run.name, run.project) == (run_id, run_id, PROJECT)
    assert run.config == config and run.config["env_id"] == "CartPole-v1"
    assert run.exit_code == 0
    assert not (run_dir / "wandb").exists()  # WANDB_DIR said where


def test_a_master_with_a_project_logs_each_run_into_its_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The setting on, the housekeeping thread does it all: the run's last figures when it
    stops, the W&B run finished, the files in `<run folder>/wandb/` (no WANDB_DIR); a master
    started again on the folder of the finished run opens no W&B run for it."""
    monkeypatch.setenv("A3C_WANDB_PROJECT", PROJECT)
    with master_running(tmp_path) as c:
        push(c, 1, [[10.0, 10], [20.0, 20]], {"train/entropy": 0.5})
        run_id = c.app.state.cluster.ledger.run_id
    again = Settings(run_dir=tmp_path / "run", workers_file=tmp_path / "workers.txt", token=None)
    with TestClient(create_app(again), client=("127.0.0.1", 50000)) as c:
        assert c.get("/status").json()["state"] == "finished"
    run = written(tmp_path / "run", run_id)  # one W&B run in the folder
    assert (run.run_id, run.project, run.exit_code) == (run_id, PROJECT, 0)
    logged = run.scalars(STEP)
    assert logged["rollout/ep_rew_mean"] == [(40, 15.0)]
    assert logged["train/entropy"] == [(40, 0.5)]


def figures(running: bool = True, points: tuple = (("rollout/ep_rew_mean", 1.0, 10),)) -> Figures:
    return Figures("20260101-000000-abcdef", running, {"lr": 0.001}, points)


def test_a_wandb_failure_is_one_warning_and_the_run_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, captured_events: CapturedEvents
) -> None:
    """W&B in a thread of its own: an init that waits on an unreachable server holds nothing up;
    the figures that came meanwhile get one attempt, and are lost with it."""
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    real_init, calls, server = wandb.init, [], threading.Event()

    def init(**kwargs: object) -> object:
        calls.append(kwargs["id"])
        if len(calls) == 1:
            server.wait(10)
        if len(calls) <= 2:
            raise wandb.errors.CommError("the network is down")
        return real_init(**kwargs)

    monkeypatch.setattr(wandb, "init", init)
    sink = WandB(tmp_path / "run", PROJECT)
    sink.write(figures(points=(("rollout/ep_rew_mean", 1.0, 10),)))
    wait_for(lambda: len(calls) == 1, 10, "the first init")
    sink.write(figures(points=(("rollout/ep_rew_mean", 2.0, 20),)))  # no wait
    sink.write(figures(points=(("rollout/ep_rew_mean", 3.0, 30),)))
    server.set()
    wait_for(lambda: len(calls) == 2, 10, "one init for the figures queued meanwhile")
    sink.write(figures(points=(("rollout/ep_rew_mean", 4.0, 40),)))
    sink.write(figures(running=False, points=()))
    sink.close()
    assert len(calls) == 3
    failed = captured_events.all("wandb_failed")  # the repeat is at DEBUG, below the level
    assert [r.levelname for r in failed] == ["WARNING"]
    assert "the network is down" in failed[0].fields["error"] and not failed[0].exc_info
    assert captured_events.one("wandb_recovered").fields["failures"] == 2
    run = written(tmp_path, "20260101-000000-abcdef")
    assert run.scalars(STEP) == {"rollout/ep_rew_mean": [(40, 4.0)]} and run.exit_code == 0


def test_only_a_run_over_before_the_master_started_gets_no_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, captured_events: CapturedEvents
) -> None:
    """The run a master finds over in its folder has had its W&B run; a run over by the first
    figures (shorter than a tick) has not; a run over whose W&B run cannot be opened is given up
    (its last figures are lost)."""
    calls = []

    def init(**kwargs: object) -> object:
        calls.append(kwargs["id"])
        raise wandb.errors.CommError("quota exceeded")

    monkeypatch.setattr(wandb, "init", init)
    found, short = "20260101-000000-abcdef", "20260101-000001-abcdef"
    sink = WandB(tmp_path / "run", PROJECT, over=found)
    sink.write(figures(running=False))
    sink.write(figures(running=False))
    sink.write(Figures(short, False, None, (("time/fps", 5.0, 10),)))  # tried: its last figures
    sink.write(Figures(short, False, None, ()))  # given up
    sink.close()
    assert calls == [short]
    assert captured_events.names() == ["wandb_failed"]  # not recovered: given up
    assert not (tmp_path / "run").exists()  # nothing of W&B was written
