"""The TensorBoard scalars (master/persistence/scalars.py), under the same names and at the same
env steps, logged to Weights & Biases when A3C_WANDB_PROJECT names a project (the `wandb` extra).

One W&B run per run of the master: its id and name are the run's id, its config the run's
training config; it is finished when the run ends (or the master stops: a master started again on
the folder resumes the same W&B run, `resume="allow"`). A run that had ended before this master
started on its folder gets none. The env steps are the `global_step` of each row, the x axis of
every chart (`define_metric`, as W&B's own TensorBoard sync does): W&B's own `_step` must only
grow, and an evaluation is charted at the earlier steps its weights were taken at.

W&B reads its own variables as usual: WANDB_MODE (offline: files only, to `wandb sync` later),
WANDB_API_KEY, WANDB_ENTITY, WANDB_DIR (unset: the run folder, so the files go into
`<run folder>/wandb/`), WANDB_CONSOLE (unset: off, the master's stdout and stderr stay its own).

W&B works in a thread of its own, fed by a bounded queue: an init that waits on an unreachable
server (90 s by default) or a finish that uploads never holds up the housekeeping thread (saves,
liveness); what came in the meantime is then taken at once. A failure (network, quota, the
wandb service gone) is logged once as a warning (`wandb_failed`; at DEBUG while it repeats,
`wandb_recovered` when it works again), and the figures it met (with those queued behind them)
are lost: the W&B run is let go and opened again (resumed, same id) with the next figures, or
given up once its run is over. W&B writes nothing of the run folder but its `wandb/` folder.
A master that stops while an init waits on the server exits once the init gives up (wandb waits
for it at exit); the run folder is saved and given up before.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from master.persistence.scalars import Figures, Point
from master.run.events import WARNING, Failures

STEP = "global_step"
QUEUE_MAX = 720  # an hour of ticks: beyond, W&B is stuck and the housekeeping chore says so
CLOSE_WAIT_S = 10.0  # how long a stopping master waits for the last figures and the finish


class WandB:
    name = "wandb"

    def __init__(self, run_dir: Path, project: str, over: str | None = None) -> None:
        """`over`: the run, over already, that the master found in its folder at start."""
        self.run_dir = Path(run_dir)
        self.project = project
        self._was_over = over
        self._queue: queue.Queue[Figures | None] = queue.Queue(QUEUE_MAX)
        self._run: Any = None  # the open W&B run (wandb.Run)
        self._run_id: str | None = None  # the run of the figures last seen
        self._over = False  # that run is over and its W&B run finished (or never to be opened)
        self._failures = Failures("logging to Weights & Biases", "wandb", level=WARNING)
        self._thread = threading.Thread(target=self._work, name="a3c-wandb", daemon=True)
        self._thread.start()

    def write(self, figures: Figures) -> None:
        """Hand one tick's figures to the W&B thread (never waits on W&B)."""
        try:
            self._queue.put_nowait(figures)
        except queue.Full:
            raise RuntimeError(
                f"Weights & Biases has not taken the figures of the last {QUEUE_MAX} ticks: "
                "these are dropped"
            ) from None

    def close(self) -> None:
        """Log what is queued, finish the W&B run, and end the thread (waits CLOSE_WAIT_S at
        most: a W&B that hangs is left to the process's exit)."""
        try:
            self._queue.put(None, timeout=CLOSE_WAIT_S)
        except queue.Full:
            return
        self._thread.join(CLOSE_WAIT_S)

    # -- the W&B thread
    # ----------------------------------------------------------------

    def _work(self) -> None:
        while True:
            failed = False
            for figures in self._take():
                if figures is None:
                    self._attempt(self._finish, self._run_id)
                    return
                if failed:
                    continue  # one attempt per batch: an init may wait 90 s on each
                failed = not self._attempt(functools.partial(self._log, figures), figures.run_id)
                if failed and not figures.running:
                    self._over = True  # its last figures are lost: not opened again to retry

    def _take(self) -> list[Figures | None]:
        """What is queued, waiting for the first: all the figures that came while W&B worked."""
        batch = [self._queue.get()]
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                return batch

    def _attempt(self, task: Callable[[], bool], run_id: str | None) -> bool:
        """Run `task`, which says whether it called W&B at all (only then is W&B working)."""
        try:
            called = task()
        except Exception as exc:
            self._failures.failed(exc, run_id)
            self._let_go()
            return False
        if called:
            self._failures.succeeded(run_id)
        return True

    def _log(self, figures: Figures) -> bool:
        if figures.run_id != self._run_id:
            self._finish()
            self._run_id, self._over = figures.run_id, figures.run_id == self._was_over
        if self._over:
            return False
        if self._run is None:
            self._run = self._open(figures)
        for step, values in _rows(figures.points):
            self._run.log({**values, STEP: step})
        if not figures.running:
            self._finish()
            self._over = True
        return True

    def _open(self, figures: Figures) -> Any:
        import wandb

        run = wandb.init(
            project=self.project,
            id=figures.run_id,
            name=figures.run_id,
            config=figures.config,
            resume="allow",
            reinit="create_new",  # this run only, whatever other run the process may have
            dir=None if os.environ.get("WANDB_DIR") else str(self.run_dir),
            settings=None if os.environ.get("WANDB_CONSOLE") else wandb.Settings(console="off"),
        )
        run.define_metric(STEP)
        run.define_metric("*", step_metric=STEP)
        return run

    def _finish(self) -> bool:
        run, self._run = self._run, None
        if run is not None:
            run.finish()
        return run is not None

    def _let_go(self) -> None:
        """After a failure: the W&B run is finished if it can be, and opened again when needed."""
        run, self._run = self._run, None
        if run is not None:
            with contextlib.suppress(Exception):  # the failure is logged already
                run.finish(exit_code=1)


def _rows(points: tuple[Point, ...]) -> list[tuple[int, dict[str, float]]]:
    """The points as W&B rows, one per step, in the order the steps come."""
    rows: dict[int, dict[str, float]] = {}
    for name, value, step in points:
        rows.setdefault(step, {})[name] = value
    return list(rows.items())
