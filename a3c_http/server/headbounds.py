"""Bounds on a request's head (its line and headers) that uvicorn does not set: its size,
A3C_MAX_HEADER_BYTES (431 and the connection closed, what comes beyond never buffered), and the
time a client may take to send it, A3C_HEADER_TIMEOUT_S from connecting or from the first byte of
the next request on a kept-alive connection. This module is the plain asyncio part: a connection's
head, its timer and how data is fed to a protocol up to the bound. Hooking it into uvicorn's
protocol classes reaches into their internals, so that is a3c_http/tuning/'s
`bound_request_heads`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

_LOG = logging.getLogger("uvicorn.error")  # where uvicorn says what it did to a request

# After a 431 the client may still be sending its head: it is read and dropped this long before
# the connection closes, since closing on unread bytes sends a reset that can destroy the 431
# before the client reads it.
LINGER_S = 2.0


class HeadBounds:
    """The bounds of this process's connections: the settings of the app made last."""

    max_bytes = 64 * 1024
    timeout_s = 10.0


bounds = HeadBounds()


class Head:
    """One connection's request head: the bytes read of it (None between heads) and the timer
    that closes the connection if it takes too long."""

    __slots__ = ("protocol", "transport", "seen", "timer", "refused", "between")

    def __init__(self, protocol: Any, transport: asyncio.Transport) -> None:
        self.protocol = protocol
        self.transport = transport
        self.seen: int | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.refused = False  # answered 431: what still comes is dropped
        self.between = True  # httptools: the last message ended, the next has not begun

    def begin(self) -> None:
        if self.seen is None and not self.refused:
            self.seen = 0
            self.timer = asyncio.get_running_loop().call_later(bounds.timeout_s, self._expire)

    def end(self) -> None:
        self.seen = None
        self.cancel()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def refuse(self) -> None:
        self.end()
        self.refused = True
        client = getattr(self.protocol, "client", None)
        _LOG.warning(
            "%s - request line and headers over A3C_MAX_HEADER_BYTES=%d bytes: 431, connection "
            "closed",
            "{}:{}".format(*client) if isinstance(client, tuple) else "a client",
            bounds.max_bytes,
        )
        detail = (
            f"the request line and headers are larger than {bounds.max_bytes} bytes "
            "(A3C_MAX_HEADER_BYTES): send fewer or shorter headers"
        )
        body = json.dumps({"detail": detail}).encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.timer = asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)


def feed(
    protocol: Any,
    head: Head,
    data: bytes,
    received: Callable[[Any, Any], None],
    settle: Callable[[Any, Head], None],
) -> None:
    """Hand `data` to the protocol, at most up to the bound while a head is being read."""
    room = bounds.max_bytes - (head.seen or 0)
    if head.seen is None or len(data) <= room:
        if head.seen is not None:
            head.seen += len(data)
        received(protocol, data)
        settle(protocol, head)
        return
    view = memoryview(data)
    if room > 0:
        head.seen = bounds.max_bytes
        received(protocol, view[:room])
        settle(protocol, head)
    if head.transport.is_closing():
        return
    if head.seen is not None:  # the bound is reached and the head goes on
        head.refuse()
        return
    received(protocol, view[room:])
    settle(protocol, head)
