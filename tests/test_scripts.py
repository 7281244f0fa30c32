"""The quickstart's progress line, the reward plot on made-up data, and the evaluation of a saved
run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from a3c_http.config import Settings, TrainConfig
from a3c_http.store import RunStore, Snapshot
from master.state import ClusterState
from scripts.evaluate import main as evaluate_main
from scripts.plot_rewards import plot
from scripts.run_local import progress_line


def status(elapsed: float, steps: int, **extra: object) -> dict:
    return {
        "elapsed_s": elapsed, "global_episode": 12, "global_steps": steps,
        "mean_return_100": 41.5, "best_score": 120.0, "updates_applied": 33,
        "workers": [{"state": "running"}, {"state": "running"}, {"state": "lost"}], **extra,
    }


def test_progress_line_measures_the_rate_between_two_statuses() -> None:
    line = progress_line(status(12.0, 30_000), status(10.0, 20_000))
    assert "env steps/s   5,000" in line
    assert "mean100   41.5" in line and "best  120" in line
    assert "workers: 1 lost, 2 running" in line
    assert "env steps/s       0" in progress_line(status(1.0, 0), None)


def test_plot_writes_a_png_with_every_episode(tmp_path: Path) -> None:
    store = RunStore.acquire(tmp_path)
    store.save(Snapshot(
        config={"env_id": "CartPole-v1", "target_return": 475.0},
        state={"run_id": "r1"},
        new_episodes=[(i, f"w{i % 2 + 1}", float(i), i, 1000.0 + i) for i in range(1, 151)],
    ))
    store.close()
    out = plot(tmp_path)
    assert out == tmp_path / "rewards.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_evaluate_plays_a_saved_run_and_ends_with_its_json_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    settings = Settings(run_dir=tmp_path / "run")
    state = ClusterState(settings)
    state.start_run(TrainConfig(seed=4, max_steps=None), ["http://127.0.0.1:9"])
    state.persist(force=True)
    version = state.params.version
    state.close()
    summary = evaluate_main([str(tmp_path / "run"), "--episodes", "3"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == summary
    assert last["episodes"] == 3 and len(last["returns"]) == 3
    assert last["env_id"] == "CartPole-v1" and last["model_version"] == version
    assert last["mean_return"] == pytest.approx(sum(last["returns"]) / 3)
    with pytest.raises(SystemExit, match="no run folder"):
        evaluate_main([str(tmp_path / "elsewhere")])
