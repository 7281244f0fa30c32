"""The quickstart's progress line (a3c-train), the reward plot on made-up data (a3c-plot), and the
evaluation of a saved run (a3c-evaluate, also through its script in a process of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from a3c_http.algos.registry import train_config
from a3c_http.cli.evaluate import play
from a3c_http.cli.plot import PlotError, plot
from a3c_http.cli.progress import progress_line, refusal, resume_note
from a3c_http.config.settings import Settings
from a3c_http.store.runstore import RunStore, Snapshot
from master.state import ClusterState

ROOT = Path(__file__).resolve().parents[2]


def status(elapsed: float, steps: int, **extra: object) -> dict:
    return {
        "elapsed_s": elapsed, "global_episode": 12, "global_steps": steps,
        "mean_return_100": 41.5, "best_score": 120.0, "updates_applied": 33,
        "workers": [{"state": "running"}, {"state": "running"}, {"state": "lost"}], **extra,
    }


def test_progress_line_measures_the_rate_between_two_statuses() -> None:
    line = progress_line(status(12.0, 30_000), status(10.0, 20_000))
    assert "env steps/s   5,000" in line
    assert "mean100   41.5" in line and "best    120" in line
    assert "workers: 1 lost, 2 running" in line
    assert "env steps/s       -" in progress_line(status(1.0, 0), None)
    # A run resumed from its last save counts from there: no rate, not a negative one.
    assert "env steps/s       -" in progress_line(status(6.0, 18_650), status(5.0, 23_187))
    # Small returns keep the decimals that tell them from the target (1.38 is not 1.4).
    small = progress_line(status(1.0, 0, mean_return_100=1.38, best_score=1.48), None)
    assert "mean100   1.38" in small and "best   1.48" in small


def test_a_refused_train_is_one_readable_line() -> None:
    """The quickstart prints the master's `detail`, not the raw JSON of its 422 or 503."""
    detail = "env_id: unknown gymnasium environment 'CartPol-v1'; did you mean 'CartPole-v1'?"
    errors = [{"loc": ["body", "env_id"], "msg": detail[8:], "type": "value_error"}]
    assert refusal(httpx.Response(422, json={"detail": detail, "errors": errors})) == (
        f"error: the master refused the config: {detail}")
    down = "no worker could be started: w1 (http://127.0.0.1:8001): cannot reach the worker"
    assert refusal(httpx.Response(503, json={"detail": down, "data": {"workers": []}})) == (
        f"error: {down}")
    assert refusal(httpx.Response(502, text="Bad Gateway")) == (
        "error: POST /train answered 502: Bad Gateway")


def test_the_quickstart_notes_a_run_its_master_cannot_resume_in_one_line() -> None:
    assert resume_note(status(1.0, 0, resume_error=None)) is None
    problem = {"error": "runs/latest/run.db holds run r1, which cannot be resumed: ...; run r1 "
               "is then moved to runs/latest/archive/r1/", "run_id": "r1"}  # fmt: skip
    note = resume_note(status(1.0, 0, resume_error=problem))
    assert note.startswith("note: runs/latest/run.db holds run r1") and "\n" not in note


def saved_run(folder: Path, run_id: str, evaluations: int = 0) -> Path:
    store = RunStore.acquire(folder)
    store.save(Snapshot(
        config={"env_id": "CartPole-v1", "target_return": 475.0, "run_id": run_id},
        state={"run_id": run_id},
        new_episodes=[(i, f"w{i % 2 + 1}", float(i), i, 1000.0 + i) for i in range(1, 151)],
        new_evaluations=[
            (k, 10 * k, 1.0 * k, 1000 * k, 20.0 * k, 2.0, 10, 20.0 * k, 1000.0 + k)
            for k in range(1, evaluations + 1)
        ],
    ))
    store.close()
    return folder


def png(path: Path) -> int:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path.stat().st_size


def test_plot_draws_every_episode_each_worker_and_the_evaluations(tmp_path: Path) -> None:
    run = saved_run(tmp_path / "a", "r1", evaluations=3)
    bare = plot(saved_run(tmp_path / "b", "r2"), tmp_path / "bare.png")
    out = plot(run)
    assert out == run / "rewards.png"
    assert png(out) > png(bare) > 10_000  # the evaluation points are drawn too


def test_plot_compares_several_runs_in_one_figure(tmp_path: Path) -> None:
    runs = [saved_run(tmp_path / "a", "r1"), saved_run(tmp_path / "b", "r2")]
    out = plot(runs)
    assert out == runs[0] / "compare.png" and png(out) > 10_000
    with pytest.raises(PlotError, match="no episodes"):
        plot([runs[0], tmp_path / "empty"])


def run_with_weights(folder: Path) -> int:
    """A run folder as a master saves it (fresh weights); its model version."""
    state = ClusterState(Settings(run_dir=folder))
    state.start_run(train_config(seed=4, max_steps=None), ["http://127.0.0.1:9"])
    state.persist(force=True)
    state.close()
    return state.params.version


def test_evaluate_plays_a_saved_run_and_ends_with_its_json_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    version = run_with_weights(tmp_path / "run")
    summary = play([str(tmp_path / "run"), "--episodes", "3"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == summary
    assert last["episodes"] == 3 and len(last["returns"]) == 3
    assert last["env_id"] == "CartPole-v1" and last["model_version"] == version
    assert last["mean_return"] == pytest.approx(sum(last["returns"]) / 3)
    with pytest.raises(SystemExit, match="elsewhere: no such folder"):
        play([str(tmp_path / "elsewhere")])


@pytest.mark.integration  # a process of its own: SDL's first start is what is judged
def test_evaluate_records_a_video_of_each_episode_quietly(tmp_path: Path) -> None:
    """In a process of its own, as a user runs it on a host without a display or a session
    (no XDG_RUNTIME_DIR): pygame starts SDL there, which would complain on stderr."""
    run_with_weights(tmp_path / "run")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SDL_", "XDG_", "DISPLAY"))}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "evaluate.py"), str(tmp_path / "run"),
         "--episodes", "2", "--video", str(tmp_path / "v")],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "XDG_RUNTIME_DIR" not in done.stderr, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["episodes"] == 2
    videos = sorted((tmp_path / "v").glob("*.mp4"))
    assert len(videos) == 2 and all(v.stat().st_size > 1000 for v in videos)


def test_evaluate_video_names_the_extra_when_rendering_needs_a_missing_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_with_weights(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "pygame", None)  # `import pygame` now fails, as without it
    with pytest.raises(SystemExit, match=r"pygame.*setup_venv\.sh video"):
        play([str(tmp_path / "run"), "--episodes", "1", "--video", str(tmp_path / "v")])


def test_evaluate_of_an_environment_module_not_allowed_here_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder holds weights: the message says so by naming what is missing, not "no run
    folder with weights here"."""
    env_id = "tests.support.envs:FailingCartPole-v0"
    monkeypatch.setenv("A3C_ENV_MODULES", "tests.support.envs")
    state = ClusterState(Settings(run_dir=tmp_path / "run"))
    state.start_run(train_config(env_id=env_id, seed=4, max_steps=None), ["http://127.0.0.1:9"])
    state.persist(force=True)
    state.close()
    monkeypatch.delenv("A3C_ENV_MODULES")
    with pytest.raises(SystemExit) as raised:
        play([str(tmp_path / "run")])
    said = str(raised.value)
    assert "its saved config does not load" in said and "no run folder" not in said
    assert "module 'tests.support.envs'" in said and "PYTHONPATH" in said
