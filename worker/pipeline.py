"""The gradient pushes a worker has in flight.

A worker that waits for each reply before it steps again spends the round trip idle: at 20 ms each
way, nine tenths of its time. Instead it hands each push to its client, which sends it from the push
process (a3c_http/net/push_process.py) or a sender thread, and goes on collecting its next rollout
with the weights it has; the pushes in flight are futures, their replies are taken between rollouts,
and the newest weights any of them brings are loaded then.

How many may be in flight is what the round trip needs, no more: the shortest recent round trip
(the path's own delay, without the time requests queue at a busy master) divided by the time the
worker takes to compute one rollout, rounded up, plus one for the jitter of the round trips, at
most `max_in_flight`. More would not make the worker faster, only its gradients staler (as a
router's deep buffer adds delay, not bandwidth).

Where staleness comes from. A push is applied after every push that reached the master since the
weights it was computed on were made. With W workers each keeping k pushes out (the one whose
rollout is being computed counts, so k is the limit + 1), that is about W x k - 1 others even with
a master that answers at once: 2W - 1 with the one push in flight loopback needs. Pushes waiting
in the master's queue (or, on a host with too few cores, for one) add to it. The shortest round
trip leaves the queue out only if some push found none: a master that is always busy makes even
the shortest round trip long, the limit rose with it, and the longer queue made the round trips
longer still, until every worker kept many pushes in flight and half of their gradients
were too old to be taken (README, "Staleness").

So the limit also counts what is in flight against the round trip actually seen (the median of the
latest, R, against the shortest, R0; TCP Vegas's rule). While a worker's pushes wait longer than it
takes to compute two rollouts (R - R0 > twice its compute time), more than one of them is in a queue
at a time, and pushing sooner only makes it longer: of the k out after a push, about k x (1 - R0 /
R) are queued, and the limit keeps that at one at most, k <= R / (R - R0). With round trips more
than twice the shortest that is no push left in flight while computing: the worker waits for each
reply, its pushes never queue behind its own, and once the queue drains the round trips shrink and
the limit is what the shortest round trip needs again. A short wait, under two rollouts' time or
under half the shortest round trip (`JITTER_SHARE`: the jitter of a busy host, and of a long path,
whose jitter grows with it), leaves the limit alone: counted as a queue, a few milliseconds of
jitter cut a worker's pushes in flight and 0.2 to 0.3 of its env steps/s 1 to 20 ms away from the
master (scripts/bench.py, section latency).

The gradients of a rollout are always those of the weights that acted in it, so they stay
on-policy; what grows with the pushes in flight is their staleness at the master, which
`max_staleness` bounds and `staleness_scaling` can weigh (README, "Staleness").
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
