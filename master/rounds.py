"""What a gradient push is answered with, and the rounds of sync_mode=sync (A2C across machines).

In sync mode the parameter server (master/params.py) gathers, for the current version, one
gradient from each running worker; when every one has sent (or `sync_timeout_s` has passed since
the round's first gradient) it applies their mean in one optimizer step, the version rises once,
and every request of the round is answered with the same new weights. A worker the round closed
without at its deadline is not waited for again until it sends: one registered but silent worker
used to make every round wait out `sync_timeout_s`.

A waiting request holds no thread: the route awaits the round's outcome on the event loop
(`settle`), so hundreds of workers cannot exhaust the threadpool. When the deadline passes before
the round is complete, the first waiting request to notice closes it (in the threadpool, since
closing runs the optimizer step), so the timeout fires even if no further request arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from starlette.concurrency import run_in_threadpool

# The new global weights (safetensors bytes) and their version.
Weights = tuple[bytes, int]


@dataclass(frozen=True)
class Update:
    """One worker's gradients as they arrived, with what it reported of them (None: not sent)."""

    worker_id: str
    version: int  # the version they were computed on
    # The body as one vector (a3c_http/flatnet.py): the gradients, then the batch moments of the
    # running statistics (a3c_http/normalize.py) if the model has any.
    vector: torch.Tensor
    seq: int | None = None
    loss: float | None = None
    norm: float | None = None  # before clipping


@dataclass(frozen=True)
class Outcome:
    """What a gradient push gets: the new weights, now (gradients mode, a retry, or the request
    that completed its round) or once its sync round closes (`round`, by `deadline`)."""

    future: Future[Weights]
    duplicate: bool = False
    round: int | None = None
    deadline: float = 0.0  # time.monotonic()

    @classmethod
    def ready(cls, weights: Weights, duplicate: bool) -> Outcome:
        future: Future[Weights] = Future()
        future.set_result(weights)
        return cls(future, duplicate)


@dataclass
class Round:
    """A sync round: the gradients gathered for `version`, one per worker."""

    number: int
    version: int
    deadline: float  # time.monotonic()
    updates: dict[str, Update] = field(default_factory=dict)
    outcome: Future[Weights] = field(default_factory=Future)
    # The running workers when the round was last looked at: those it closes without at its
    # deadline are absent from the next rounds until they send (master/params.py).
    expected: set[str] = field(default_factory=set)

    def waiting(self, duplicate: bool) -> Outcome:
        return Outcome(self.outcome, duplicate, self.number, self.deadline)

    def complete(self, expected: set[str]) -> bool:
        """Every worker the round waits for has sent its gradient."""
        return expected <= self.updates.keys()


async def settle(outcome: Outcome, close_round: Callable[[int], None]) -> tuple[bytes, int, bool]:
    """The new weights, their version and whether the request was a retry, once the outcome is
    known; at the round's deadline, `close_round(number)` closes it with what it gathered. Raises
    what the round failed with (StateConflict: the run ended, or the weights were replaced)."""
    if not outcome.future.done():
        waiting = asyncio.wrap_future(outcome.future)
        try:
            await asyncio.wait_for(
                asyncio.shield(waiting), max(0.0, outcome.deadline - time.monotonic())
            )
        except TimeoutError:
            await run_in_threadpool(close_round, outcome.round)
            await waiting
    weights, version = outcome.future.result()
    return weights, version, outcome.duplicate
