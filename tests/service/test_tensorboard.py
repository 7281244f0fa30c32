"""The master's TensorBoard scalars, read back with TensorBoard's own event reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.charted_run import charted_run, tensorboard_scalars

pytest.importorskip("tensorboard", reason="the `tensorboard` extra is not installed")
from master.persistence.tensorboard import TensorBoard  # noqa: E402


def test_the_scalars_people_chart_are_written_and_read_back(tmp_path: Path) -> None:
    board = TensorBoard(tmp_path / "board")
    run_id, _ = charted_run(tmp_path, [board])
    scalars = tensorboard_scalars(tmp_path / "board" / "tensorboard" / run_id)
    # Stepped by the run's env steps: the reported workers' 40 and 80.
    assert scalars["rollout/ep_rew_mean"] == [(40, 15.0), (80, 20.0)]
    assert scalars["rollout/ep_len_mean"] == [(80, 30.0)]  # the one episode between the ticks
    assert len(scalars["time/fps"]) == 1 and scalars["time/fps"][0][1] > 0
    assert scalars["train/policy_loss"][-1] == (80, -0.5)
    assert scalars["train/value_loss"][-1] == (80, 2.0)
    assert scalars["train/entropy"][-1] == (80, pytest.approx(0.6))
    assert scalars["eval/mean_reward"] == [(60, 42.0)]  # at the steps its weights were taken
