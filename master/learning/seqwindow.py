"""Which of a worker's request numbers (`X-A3C-Seq`) the master has taken.

A worker keeps several gradient pushes in flight, over several connections, so its numbers can
arrive out of order: 7 may land before 6. The master therefore keeps, per worker, the highest
number taken and one bit for each of the `WIDTH` numbers below it (the anti-replay window of IPsec,
RFC 4303). A number in the window is taken once; one older than the window is treated as taken
(a retry that late would be far staler than `max_staleness` allows anyway, and an episode report
is never counted twice).
"""

from __future__ import annotations

from typing import Any

WIDTH = 256
_FULL = (1 << WIDTH) - 1


class SeqWindow:
    __slots__ = ("high", "mask")

    def __init__(self, high: int = 0, mask: int = _FULL) -> None:
        self.high = high
        self.mask = mask  # bit i: number high - i was taken

    def seen(self, seq: int) -> bool:
        if seq > self.high:
            return False
        back = self.high - seq
        return back >= WIDTH or bool(self.mask >> back & 1)

    def add(self, seq: int) -> None:
        if seq > self.high:
            shift = seq - self.high
            self.mask = (self.mask << shift | 1) & _FULL if shift < WIDTH else 1
            self.high = seq
        elif self.high - seq < WIDTH:
            self.mask |= 1 << (self.high - seq)

    def to_json(self) -> list[Any]:
        return [self.high, format(self.mask, "x")]

    @classmethod
    def from_json(cls, data: Any) -> SeqWindow:
        """From `to_json`, or the single number an earlier version saved (every number up to it
        taken)."""
        if isinstance(data, list):
            return cls(int(data[0]), int(data[1], 16))
        return cls(int(data or 0))
