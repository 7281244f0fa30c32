"""Evaluation of the global network while it trains, as Gorila's and DPPO's separate evaluators.

Every `eval_every_updates` model versions, the global weights are played greedily
(a3c_http/policy/evaluation.py) in a child process of the master, so stepping environments never
holds the GIL that the request handlers need. The parameter server only hands over its cached
weights bytes: no lock is held while they play.

The evaluator's own thread decides when an evaluation is due (the model version advanced by
`eval_every_updates` since the last one started; once more when the run finishes, for the final
weights, unless the last evaluation took them), sends the weights to the child and waits for
the result, which goes to the run ledger (the `eval_*` fields of /status, the run folder's
`evaluations` table, `solved_on=eval`). So at most one evaluation is in flight, and one that falls
due meanwhile starts when it ends: none queue up. A failed evaluation never stops the run: its
error is `eval_error` in /status, and in the log (master/run/events.py).

The child is started at the first evaluation of a run and ended once the run is over and nothing is
in flight, or at shutdown (an evaluation in flight is then dropped). It is a plain process
with a pipe rather than a ProcessPoolExecutor: Python 3.11's pool cannot end a task in flight
(`terminate_workers` came in 3.14), and its exit handler would make a stopping master wait for it.
It starts as the learner does, from the master's fork server (master/learning/learner_needs.py
`child_context`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

from a3c_http.config.training import TrainConfig
from a3c_http.policy.evaluation import serve
from master.learning.learner_needs import child_context
from master.learning.parameter_server import ParameterServer
from master.run.ledger import RunLedger

logger = logging.getLogger("a3c.master.evaluator")

# record(run_id, taken, result, error): see RunLedger.record_evaluation.
Record = Callable[[str, dict[str, Any], dict[str, Any] | None, str | None], None]


class _Child:
    """The evaluation process (a3c_http.policy.evaluation.serve) and the master's end of its
    pipe."""

    def __init__(self) -> None:
        context = child_context()
        self.conn, child_end = context.Pipe()
        self.process = context.Process(
            target=serve, args=(child_end,), name="a3c-evaluation", daemon=True
        )
        self.process.start()
        child_end.close()

    def play(self, config: TrainConfig, weights: bytes, stop: threading.Event) -> Any:
        """Send one evaluation and wait for its reply; None when `stop` was set meanwhile.
        Raises EOFError or OSError when the process ended."""
        self.conn.send((config, weights))
        while not self.conn.poll(0.5):
            if stop.is_set():
                return None
            if not self.process.is_alive():
                break
        try:
            return self.conn.recv()
        except EOFError:
            raise EOFError(
                f"the evaluation process ended with exit code {self.process.exitcode}"
            ) from None

    def close(self) -> None:
        self.process.terminate()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class Evaluator:
    # How often the thread looks whether an evaluation is due.
    poll_s = 0.5

    def __init__(self, ledger: RunLedger, params: ParameterServer, record: Record) -> None:
        self.ledger = ledger
        self.params = params
        self.record = record
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards `_child` between the thread and close()
        self._child: _Child | None = None
        self._started: tuple[str, int] | None = None  # run id and version of the last one

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="a3c-evaluator")
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and end the child (an evaluation in flight is dropped)."""
        self._stop.set()
        with self._lock:
            child, self._child = self._child, None
            if child is not None:
                child.process.terminate()  # unblocks the thread if it waits on the child
        if self._thread is not None:
            self._thread.join(timeout=15)
        if child is not None:
            child.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._step()
            except Exception:  # this thread must outlive any surprise; the run goes on
                logger.exception("evaluation: unexpected error")

    def _step(self) -> None:
        due = self._take_if_due()
        if due is None:
            if self.ledger.should_stop():  # the run is over: free the child's memory
                self._end_child()
            return
        run_id, taken, config, weights = due
        result, error = self._play(config, weights)
        if self._stop.is_set():
            return
        self.record(run_id, taken, result, error)

    def _take_if_due(self) -> tuple[str, dict[str, Any], TrainConfig, bytes] | None:
        """The run, its counters, config and weights when an evaluation is due, read under the
        ledger's and the parameter server's locks so that they belong to one run."""
        ledger, params = self.ledger, self.params
        with ledger.lock, params.lock:
            config, run_id = ledger.config, ledger.run_id
            if config is None or not config.eval_every_updates:
                return None
            # Versions needed since the last one: while it runs, eval_every_updates; once it has
            # finished, any, so that its final weights are played once.
            needed = {"running": config.eval_every_updates, "finished": 1}.get(ledger.run_state)
            if needed is None or params.version - self._last_started(run_id) < needed:
                return None
            weights, version = params.stored_weights()
            taken = {
                "model_version": version,
                "elapsed_s": round(ledger.elapsed_s(), 3),
                "global_steps": ledger.env_steps(),
            }
        self._started = (run_id, version)
        return run_id, taken, config, weights

    def _last_started(self, run_id: str) -> int:
        """The version the last evaluation of this run took (after a restart: the latest one
        recorded), or the run's first version."""
        if self._started is not None and self._started[0] == run_id:
            return self._started[1]
        latest = self.ledger.evals.latest
        return latest["model_version"] if latest else self.params.first_version

    def _play(
        self, config: TrainConfig, weights: bytes
    ) -> tuple[dict[str, Any] | None, str | None]:
        """(result, None) or (None, error)."""
        try:
            with self._lock:
                if self._stop.is_set():
                    return None, None
                if self._child is None:
                    self._child = _Child()
                child = self._child
            reply = child.play(config, weights, self._stop)
        except Exception as exc:  # the process cannot start, or ended: the next one starts anew
            self._end_child()
            return None, str(exc) if isinstance(exc, EOFError) else f"{type(exc).__name__}: {exc}"
        if reply is None:
            return None, None
        status, payload = reply
        if status != "ok":
            return None, payload
        result = dataclasses.asdict(payload)
        if not all(math.isfinite(result[k]) for k in ("mean_return", "std_return")):
            # JSON has no NaN or infinity: /status and the run folder could not hold them.
            return None, f"the environment's returns are not finite: {payload.returns[:10]}"
        return result, None

    def _end_child(self) -> None:
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.close()
