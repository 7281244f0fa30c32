"""The gradient pushes a worker has in flight.

A worker that waits for each reply spends the round trip idle. Instead it hands each push to its
client (the push process, a3c_http/net/push_process.py, or a sender thread) and goes on collecting
its next rollout; the pushes in flight are futures, their replies are taken between rollouts, and
the newest weights any of them brings are loaded then.

The limit on pushes in flight is what the round trip needs and no more, since more only makes
gradients staler: the shortest recent round trip R0 (the path's own delay) over the compute time
of one rollout, rounded up, plus one for jitter, at most `max_in_flight`. While the round trips
actually seen (the median of the latest, R) exceed R0 by more than two rollouts' compute time and
by more than `JITTER_SHARE` of R0, the worker's pushes are queueing at the master, and the limit
keeps about one of them queued: k <= R / (R - R0) (TCP Vegas's rule), down to waiting for each
reply. Smaller waits are jitter and leave the limit alone. Why and what it does to staleness:
docs/performance.md, "Staleness".

A rollout's gradients are always those of the weights that acted in it (on-policy); what grows
with the pushes in flight is their staleness at the master, bounded by `max_staleness`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from concurrent.futures import Future

from a3c_http.net.push_process import wait_for_replies

# Round trips remembered for the shortest one: a few seconds of pushes, so a changed path is
# followed.
_RTT_WINDOW = 200
# Rollouts whose compute time is remembered.
_COMPUTE_WINDOW = 15
# A wait longer than the shortest round trip by less than this share of it is the path's jitter.
JITTER_SHARE = 0.5
# The latest round trips, whose median is the round trip actually seen.
_RECENT_WINDOW = 9


class Pipeline:
    def __init__(self, max_in_flight: int) -> None:
        """`max_in_flight`: pushes that may be in flight while the caller computes (0: none,
        each reply is awaited at once)."""
        self.max_in_flight = max_in_flight
        self._in_flight: deque[Future] = deque()
        self._round_trips: deque[float] = deque(maxlen=_RTT_WINDOW)
        self._computes: deque[float] = deque(maxlen=_COMPUTE_WINDOW)
        self.compute_s: float | None = None  # median time of one rollout and its gradients
        self._limit: int | None = None  # `limit`, until a new figure comes in

    def __len__(self) -> int:
        return len(self._in_flight)

    @property
    def round_trip_s(self) -> float | None:
        """The shortest recent round trip."""
        return min(self._round_trips, default=None)

    @property
    def recent_round_trip_s(self) -> float | None:
        """The median of the latest round trips: the round trip actually seen."""
        recent = list(self._round_trips)[-_RECENT_WINDOW:]
        return statistics.median(recent) if recent else None

    @property
    def limit(self) -> int:
        """`_limit`, computed again only when a round trip or a compute time came in since."""
        if self._limit is None:
            self._limit = self._compute_limit()
        return self._limit

    def _compute_limit(self) -> int:
        """Pushes that may stay in flight while the next rollout is computed: what the shortest
        round trip needs, and, while the round trips seen are longer than it by more than two
        rollouts' compute time and half the shortest, no more than keeps one of this worker's
        pushes queued (the module's docstring; 0: wait for each reply)."""
        rtt, compute = self.round_trip_s, self.compute_s
        if self.max_in_flight == 0 or rtt is None or not compute:
            return min(1, self.max_in_flight)
        needed = math.ceil(rtt / compute) + 1
        recent = self.recent_round_trip_s
        if recent is not None and recent - rtt > max(2 * compute, JITTER_SHARE * rtt):
            needed = min(needed, math.floor(recent / (recent - rtt)) - 1)
        return min(self.max_in_flight, needed)

    def computed(self, seconds: float) -> None:
        """The caller took `seconds` to compute one rollout and its gradients. The median of the
        last few: the first rollouts of a run are slow (torch's first calls), and a moving
        average would hold the limit down for a second or more."""
        self._computes.append(seconds)
        self.compute_s = statistics.median(self._computes)
        self._limit = None

    def add(self, push: Future) -> None:
        """A push on its way (MasterClient.push_gradients_async): `push` completes with its
        reply."""
        started = time.monotonic()

        def timed(done: Future) -> None:
            # Until the reply came, not until it was read: the push process's own figure.
            round_trip = getattr(done, "round_trip_s", None)
            if round_trip is None:
                round_trip = time.monotonic() - started
            self._round_trips.append(round_trip)
            self._limit = None

        push.add_done_callback(timed)
        self._in_flight.append(push)

    def completed(self) -> list[Future]:
        """The pushes that are done, once at most `limit` are still in flight (waiting for
        replies until then)."""
        done: list[Future] = []
        while True:
            finished = [f for f in self._in_flight if f.done()]
            for future in finished:
                self._in_flight.remove(future)
            done += finished
            if len(self._in_flight) <= self.limit:
                return done
            wait_for_replies(self._in_flight)

    def drain(self) -> list[Future]:
        """Every push still in flight, once its reply is in (at the end of a run, so that what
        the master took is counted)."""
        done = list(self._in_flight)
        self._in_flight.clear()
        wait_for_replies(done, every=True)
        return done
