"""What a gradient push is answered with, and the rounds of algo a2c (A2C across machines).

In sync mode the parameter server (master/learning/parameter_server.py) gathers, for the current
version, one gradient from each running worker; when every one has sent (or `sync_timeout_s` has
passed since the round's first gradient) it applies their mean in one optimizer step, the version
rises once, and every request of the round is answered with the same new weights. A worker the round
closed without at its deadline is not waited for again until it sends: one registered but silent
worker used to make every round wait out `sync_timeout_s`.

A waiting request holds no thread: the route awaits the round's outcome on the event loop
(`await_outcome`), so hundreds of workers cannot exhaust the threadpool. When the deadline passes
before the round is complete, the first waiting request to notice closes it (in the threadpool,
since closing runs the optimizer step), so the timeout fires even if no further request arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from starlette.concurrency import run_in_threadpool

from master.errors import StateConflict

if TYPE_CHECKING:
    from a3c_http.config.training import TrainConfig

# The new global weights (safetensors bytes) and their version.
Weights = tuple[bytes, int]


@dataclass(frozen=True)
class Update:
    """One worker's gradients as they arrived, with what it reported of them (None: not sent)."""

    worker_id: str
    version: int  # the version they were computed on
    # The body as one vector (a3c_http/optim/flatnet.py): the gradients, then the batch moments of
    # the running statistics (a3c_http/models/normalize.py) if the model has any.
    vector: torch.Tensor
    seq: int | None = None
    loss: float | None = None
    norm: float | None = None  # before clipping


@dataclass(frozen=True)
class Outcome:
    """What a gradient push gets: the new weights, now (`weights`: gradients mode, a retry, or
    the request that completed its round) or once its sync round closes (`future`, `round`, by
    `deadline`). A known answer holds no future: making one and setting its result cost a push
    about a tenth of the master's step (a lock and a condition)."""

    future: Future[Weights] | None
    duplicate: bool = False
    round: int | None = None
    deadline: float = 0.0  # time.monotonic()
    weights: Weights | None = None

    @classmethod
    def ready(cls, weights: Weights, duplicate: bool) -> Outcome:
        return cls(None, duplicate, weights=weights)

    def is_done(self) -> bool:
        return self.future is None or self.future.done()


@dataclass
class Round:
    """A sync round: the gradients gathered for `version`, one per worker."""

    number: int
    version: int
    deadline: float  # time.monotonic()
    updates: dict[str, Update] = field(default_factory=dict)
    outcome: Future[Weights] = field(default_factory=Future)
    # The running workers when the round was last looked at: those it closes without at its deadline
    # are absent from the next rounds until they send (master/learning/parameter_server.py).
    expected: set[str] = field(default_factory=set)

    def pending_outcome(self, duplicate: bool) -> Outcome:
        return Outcome(self.outcome, duplicate, self.number, self.deadline)

    def complete(self, expected: set[str]) -> bool:
        """Every worker the round waits for has sent its gradient."""
        return expected <= self.updates.keys()


async def await_outcome(
    outcome: Outcome, close_round: Callable[[int], None]
) -> tuple[bytes, int, bool]:
    """The new weights, their version and whether the request was a retry, once the outcome is
    known; at the round's deadline, `close_round(number)` closes it with what it gathered. Raises
    what the round failed with (StateConflict: the run ended, or the weights were replaced)."""
    if not outcome.is_done():
        waiting = asyncio.wrap_future(outcome.future)
        try:
            await asyncio.wait_for(
                asyncio.shield(waiting), max(0.0, outcome.deadline - time.monotonic())
            )
        except TimeoutError:
            await run_in_threadpool(close_round, outcome.round)
            await waiting
    return outcome_reply(outcome)


def outcome_reply(outcome: Outcome) -> tuple[bytes, int, bool]:
    """`await_outcome`'s answer for an outcome that `is_done()`."""
    weights, version = outcome.weights if outcome.future is None else outcome.future.result()
    return weights, version, outcome.duplicate


class SyncRounds:
    """The parameter server's (master/learning/parameter_server.py `ParameterServer`, which inherits
    them) methods for sync mode's rounds, apart because they are an idea of their own. They run
    under its lock (`lock`) and use its retry check (`_is_retry`), screening (`_screen`,
    `_join_outlier_window`), optimizer step (`_step`), weights (`weights`, `version`), refusal
    counts (`_reject`) and round numbers (`_round_numbers`, never reused, so a late timeout closes
    no other round)."""

    def _reset_rounds(self) -> None:
        self.round: Round | None = None  # the round gathering gradients
        self.sync_rounds = 0  # rounds applied in this run
        self.sync_gradients = 0  # gradients those rounds averaged
        # Workers a round closed without at its deadline: no round waits for them until they send
        # again (a registered but silent worker would delay every round).
        self.absent: set[str] = set()

    def join_round(
        self,
        update: Update,
        config: TrainConfig,
        refusal: StateConflict | None,
        expected: set[str],
    ) -> Outcome:
        """Add gradients to the current sync round (one per worker, for the current version);
        the round closes at once when every worker of `expected` has sent, else at its deadline
        or when `check_round` finds it complete. A retry of gradients of this round waits for
        the same outcome; of an earlier round, it gets the current weights."""
        with self.lock:
            if self._is_retry(update.worker_id, update.seq):
                return Outcome.ready(self.weights(), duplicate=True)
            current = self.round
            sent = current.updates.get(update.worker_id) if current is not None else None
            if sent is not None:
                if update.seq is not None and update.seq == sent.seq:
                    return current.pending_outcome(duplicate=True)
                self._reject("round")
                raise StateConflict(
                    f"worker {update.worker_id} already sent gradients for version "
                    f"{current.version} in this round (algo a2c takes one per worker and "
                    "round): wait for the round's reply"
                )
            self._screen(update, config, refusal, sync=True)
            self._join_outlier_window(update)
            self.absent.discard(update.worker_id)
            if current is None:
                deadline = time.monotonic() + config.sync_timeout_s
                current = self.round = Round(next(self._round_numbers), self.version, deadline)
            current.updates[update.worker_id] = update
            current.expected = expected
            outcome = current.pending_outcome(duplicate=False)
            if current.complete(expected - self.absent):
                self._close_round()
            return outcome

    def check_round(self, expected: set[str], running: bool) -> None:
        """Close the open round when the workers it still waits for are gone (lost, done or
        failed), or the run is no longer running: nobody else will send for it. Also when its
        deadline passed, should every request waiting for it have gone (disconnected)."""
        with self.lock:
            current = self.round
            if current is None:
                return
            current.expected = expected
            if not running or current.complete(expected - self.absent):
                self._close_round()
            elif time.monotonic() >= current.deadline:
                self._close_round(at_deadline=True)

    def close_round(self, number: int) -> None:
        """The deadline of round `number` passed: apply what it gathered, unless it is closed."""
        with self.lock:
            if self.round is not None and self.round.number == number:
                self._close_round(at_deadline=True)

    def _close_round(self, at_deadline: bool = False) -> None:
        """One optimizer step on the mean of the round's gradients, and every request of the
        round gets the new weights. `at_deadline`: the workers it still waited for are absent
        from now on, until they send."""
        current, self.round = self.round, None
        if at_deadline:
            self.absent |= current.expected - current.updates.keys()
        try:
            self._step(list(current.updates.values()))
            self.sync_rounds += 1
            self.sync_gradients += len(current.updates)
            current.outcome.set_result(self.weights())
        except Exception as exc:  # the waiting requests fail with it, not the closing thread
            current.outcome.set_exception(exc)

    def _abandon_round(self, why: StateConflict) -> None:
        """The round's gradients can no longer be applied: its requests are refused."""
        current, self.round = self.round, None
        if current is not None:
            self._reject("round", len(current.updates))
            current.outcome.set_exception(why)
