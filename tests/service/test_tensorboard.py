"""The master's TensorBoard scalars, read back with TensorBoard's own event reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.common import master_running, push_rollout

pytest.importorskip("tensorboard", reason="the `tensorboard` extra is not installed")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from master.persistence.tensorboard import TensorBoard  # noqa: E402


def push(c, seq: int, episodes: list, metrics: dict) -> None:
    stats = {"env_steps": 40 * seq, "metrics": metrics}
    assert push_rollout(c, seq, episodes, stats).status_code == 200


def test_the_scalars_people_chart_are_written_and_read_back(tmp_path: Path) -> None:
    board = TensorBoard(tmp_path / "board")
    losses = {"train/policy_loss": -0.5, "train/value_loss": 2.0, "train/entropy": 0.6}
    with master_running(tmp_path) as c:
        state = c.app.state.cluster
        push(c, 1, [[10.0, 10], [20.0, 20]], losses)
        board.tick(state.status())
        push(c, 2, [[30.0, 30]], losses)
        run_id = state.ledger.run_id
        taken = {"model_version": 1, "elapsed_s": 1.0, "global_steps": 60}
        state.record_evaluation(
            run_id, taken,
            {"mean_return": 42.0, "std_return": 1.0, "episodes": 3, "mean_length": 42.0}, None,
        )  # fmt: skip
        board.tick(state.status())
    board.close()
    events = EventAccumulator(str(tmp_path / "board" / "tensorboard" / run_id))
    events.Reload()
    tags = events.Tags()["scalars"]
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in tags}
    # Stepped by the run's env steps: the reported workers' 40 and 80.
    assert scalars["rollout/ep_rew_mean"] == [(40, 15.0), (80, 20.0)]
    assert scalars["rollout/ep_len_mean"] == [(80, 30.0)]  # the one episode between the ticks
    assert len(scalars["time/fps"]) == 1 and scalars["time/fps"][0][1] > 0
    assert scalars["train/policy_loss"][-1] == (80, -0.5)
    assert scalars["train/value_loss"][-1] == (80, 2.0)
    assert scalars["train/entropy"][-1] == (80, pytest.approx(0.6))
    assert scalars["eval/mean_reward"] == [(60, 42.0)]  # at the steps its weights were taken
