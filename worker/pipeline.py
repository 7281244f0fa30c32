"""The gradient pushes a worker has in flight.

A worker that waits for each reply before it steps again spends the round trip idle: at 20 ms each
way, nine tenths of its time. Instead it hands each push to a small pool of sender threads and
goes on collecting its next rollout with the weights it has; the replies are taken between
rollouts, and the newest weights any of them brings are loaded then. At most `limit` pushes are in
flight; with a fast master the replies come back before the next rollout is ready and only one
ever is. The gradients of a rollout are always those of the weights that acted in it, so they stay
on-policy; what grows with the pushes in flight is their staleness at the master, which
`max_staleness` bounds (docs: README, "Latency").
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any


class Pipeline:
    def __init__(self, limit: int) -> None:
        """`limit`: pushes that may be in flight while the caller computes (0: none, each
        reply is awaited at once)."""
        self.limit = limit
        self._pool = ThreadPoolExecutor(max_workers=max(1, limit), thread_name_prefix="a3c-push")
        self._in_flight: deque[Future] = deque()
        self.round_trip_s: float | None = None  # moving average of the last replies' round trips

    def __len__(self) -> int:
        return len(self._in_flight)

    def submit(self, send: Callable[[], Any]) -> None:
        started = time.monotonic()

        def timed() -> Any:
            try:
                return send()
            finally:
                took = time.monotonic() - started
                rtt = self.round_trip_s
                self.round_trip_s = took if rtt is None else 0.9 * rtt + 0.1 * took

        self._in_flight.append(self._pool.submit(timed))

    def completed(self) -> list[Future]:
        """The pushes that are done, in the order they were sent, once at most `limit` are
        still in flight (waiting for replies until then)."""
        done: list[Future] = []
        while True:
            finished = [f for f in self._in_flight if f.done()]
            for future in finished:
                self._in_flight.remove(future)
            done += finished
            if len(self._in_flight) <= self.limit:
                return done
            wait(self._in_flight, return_when=FIRST_COMPLETED)

    def drain(self) -> list[Future]:
        """Every push still in flight, once its reply is in (at the end of a run, so that what
        the master took is counted)."""
        done = list(self._in_flight)
        self._in_flight.clear()
        wait(done)
        return done

    def close(self) -> None:
        """Stop sending: what is queued is dropped, what is on the wire finishes on its own."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._in_flight.clear()
