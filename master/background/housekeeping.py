"""The master's housekeeping thread: what happens on a clock rather than on a request.

Every tick (half a second, or the persist interval if shorter) it marks silent workers lost;
every `persist_interval_s` it saves what changed and puts back the folder's lock file if a hand
removed it; every `scalars.INTERVAL_S` it computes the run's scalars once and hands them to each
sink (TensorBoard when its extra is installed, Weights & Biases when A3C_WANDB_PROJECT is set);
and it logs the progress line every `log_progress_s`.

No chore's failure ends the thread: each is caught and logged (master/run/events.py `Failures`: once
when it starts, with the error and its traceback; at DEBUG while it repeats; once when the chore
works again), and the next tick tries again. So saving resumes by itself once a full disk has
room again (the persister records and logs its own failures, which any save may meet).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence

from master.persistence.scalars import INTERVAL_S, Scalars, Sink
from master.run.events import Failures, ProgressLog
from master.state import ClusterState


class _Chores:
    """Runs the chores, each with its own failure record."""

    def __init__(self) -> None:
        self._failures: dict[str, Failures] = {}

    def run(self, name: str, chore: Callable[[], object]) -> None:
        failures = self._failures.get(name)
        if failures is None:
            failures = self._failures[name] = Failures(
                f"the housekeeping chore {name!r}", "housekeeping", traceback=True, chore=name
            )
        try:
            chore()
        except Exception as exc:
            failures.failed(exc)
            return
        failures.succeeded()


def run(state: ClusterState, stop: threading.Event, sinks: Sequence[Sink] = ()) -> None:
    """The thread's body, until `stop` is set; then the run's last figures, and the sinks closed."""
    progress = ProgressLog(state.settings.log_progress_s)
    interval = state.settings.persist_interval_s
    tick = min(0.5, interval)
    ticks_per_persist = max(1, round(interval / tick))
    ticks_per_chart = max(1, round(INTERVAL_S / tick))
    chores = _Chores()
    scalars = Scalars()

    def chart() -> None:  # computed once; each sink's failure is its own chore's
        figures = scalars.tick(state.status())
        if figures is not None:
            for sink in sinks:
                chores.run(sink.name, functools.partial(sink.write, figures))

    n = 0
    while not stop.wait(tick):
        chores.run("liveness", state.check_liveness)
        n += 1
        if n % ticks_per_persist == 0:
            chores.run("save", state.persist)
            chores.run("lock file", state.keep_folder)
        if sinks and n % ticks_per_chart == 0:
            chores.run("scalars", chart)
        chores.run("progress", lambda: progress.tick(state.status))
    if sinks:
        chores.run("scalars", chart)  # the run's last figures
        for sink in sinks:
            chores.run(sink.name, sink.close)
