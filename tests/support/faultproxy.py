"""A TCP proxy on loopback that loses replies: the faults a flaky network does to HTTP.

Every connection is forwarded to the upstream service. With probability `drop_reply_p`, the first
bytes of a reply are thrown away and both connections are closed: the service has done the work,
but the client never learns it and must retry. That is the case that double-counts a
non-idempotent POST unless the service recognises the retry.
"""

from __future__ import annotations

import random

from a3c_http.testing.delayproxy import LoopbackProxy


class FaultProxy(LoopbackProxy):
    def __init__(self, upstream_port: int, drop_reply_p: float, seed: int = 0) -> None:
        super().__init__(upstream_port, "127.0.0.1", "127.0.0.1")
        self.drop_reply_p = drop_reply_p
        self.random = random.Random(seed)
        self.replies = 0  # reply chunks forwarded
        self.dropped = 0  # replies lost on purpose

    def _forward(self, client_r, client_w, up_r, up_w) -> list:
        async def requests() -> None:
            while data := await client_r.read(65536):
                up_w.write(data)
                await up_w.drain()

        async def replies() -> None:
            while data := await up_r.read(65536):
                if self.random.random() < self.drop_reply_p:
                    self.dropped += 1
                    return  # the pair is closed with the reply unsent
                self.replies += 1
                client_w.write(data)
                await client_w.drain()

        return [requests(), replies()]
