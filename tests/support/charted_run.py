"""One short run of an in-process master whose scalars (master/persistence/scalars.py) are computed
by hand at three ticks and handed to the sinks under test, as the housekeeping thread hands them:
two pushes (episodes of returns 10, 20 then 30; 40 env steps each), an evaluation taken at 60
env steps, and a last tick once the run is over."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from master.persistence.scalars import Scalars, Sink
from tests.support.common import master_running, push_rollout

LOSSES = {"train/policy_loss": -0.5, "train/value_loss": 2.0, "train/entropy": 0.6}


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """`{name: [(step, value), ...]}` of a TensorBoard run folder, read by TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    tags = events.Tags()["scalars"]
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in tags}


def push(c, seq: int, episodes: list, metrics: dict) -> None:  # noqa: ANN001 (a TestClient)
    stats = {"env_steps": 40 * seq, "metrics": metrics}
    assert push_rollout(c, seq, episodes, stats).status_code == 200


def charted_run(tmp_path: Path, sinks: Sequence[Sink]) -> tuple[str, dict]:
    """Play the run, the sinks closed at the end; its id and training config."""
    scalars = Scalars()

    def tick(status: dict) -> None:
        figures = scalars.tick(status)
        assert figures is not None
        for sink in sinks:
            sink.write(figures)

    with master_running(tmp_path) as c:
        state = c.app.state.cluster
        push(c, 1, [[10.0, 10], [20.0, 20]], LOSSES)
        tick(state.status())
        push(c, 2, [[30.0, 30]], LOSSES)
        run_id, config = state.ledger.run_id, state.status()["config"]
        taken = {"model_version": 1, "elapsed_s": 1.0, "global_steps": 60}
        state.record_evaluation(
            run_id, taken,
            {"mean_return": 42.0, "std_return": 1.0, "episodes": 3, "mean_length": 42.0}, None,
        )  # fmt: skip
        tick(state.status())
        state.finish("the test is over")
        tick(state.status())  # nothing new: the run is over (W&B finishes its run)
    for sink in sinks:
        sink.close()
    return run_id, config
