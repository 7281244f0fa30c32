"""Bounds on a request's head (its line and headers) that uvicorn does not set: its size,
A3C_MAX_HEADER_BYTES (431 and the connection closed, the rest never buffered), and the time a
client may take to send it, A3C_HEADER_TIMEOUT_S from connecting or from the first byte of the
next request on a kept-alive connection (the connection closed).

Written against uvicorn 0.54.0. Its default protocol, httptools, gathers a header of any size in
memory (a 64 MiB one cost the master 60 MB), and neither of its protocols closes a connection
that never completes a request: the keep-alive timeout starts only after a response, so idle
sockets stay open for ever. The app cannot help, since uvicorn calls it only once the head is
complete; and uvicorn picks its protocol class before it imports the app, so `install` wraps
methods of the classes themselves (`HttpToolsProtocol`, `H11Protocol`), once per process, when an
app is made. A class that lacks a method this wraps is left as it is, with a warning.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import logging
from collections.abc import Callable
from typing import Any

_LOG = logging.getLogger("uvicorn.error")
# After a 431 the client may still be sending its head: it is read and dropped this long before
# the connection closes, since closing on unread bytes sends a reset that can destroy the 431
# before the client reads it.
LINGER_S = 2.0


class _Bounds:
    """The bounds of this process's connections: the settings of the app made last."""

    max_bytes = 64 * 1024
    timeout_s = 10.0


_bounds = _Bounds()
_tried: set[str] = set()  # classes wrapped, or found lacking, in this process


class _Head:
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
            self.timer = asyncio.get_running_loop().call_later(_bounds.timeout_s, self._expire)

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
            _bounds.max_bytes,
        )
        detail = (
            f"the request line and headers are larger than {_bounds.max_bytes} bytes "
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


def _feed(
    protocol: Any,
    head: _Head,
    data: bytes,
    received: Callable[[Any, Any], None],
    settle: Callable[[Any, _Head], None],
) -> None:
    """Hand `data` to the protocol, at most up to the bound while a head is being read."""
    room = _bounds.max_bytes - (head.seen or 0)
    if head.seen is None or len(data) <= room:
        if head.seen is not None:
            head.seen += len(data)
        received(protocol, data)
        settle(protocol, head)
        return
    view = memoryview(data)
    if room > 0:
        head.seen = _bounds.max_bytes
        received(protocol, view[:room])
        settle(protocol, head)
    if head.transport.is_closing():
        return
    if head.seen is not None:  # the bound is reached and the head goes on
        head.refuse()
        return
    received(protocol, view[room:])
    settle(protocol, head)


def _wrap(
    cls: type,
    idle: Callable[[Any, _Head], bool],
    settle: Callable[[Any, _Head], None],
    on_made: Callable[[Any], None] | None = None,
) -> None:
    """Wrap the connection methods of `cls`: `idle` says whether the protocol waits for a new
    request (so that the data received starts a head), `settle` ends the head once complete."""
    made, received, lost = cls.connection_made, cls.data_received, cls.connection_lost

    @functools.wraps(made)
    def connection_made(self: Any, transport: asyncio.Transport) -> None:
        made(self, transport)
        if on_made is not None:
            on_made(self)
        self._a3c_head = _Head(self, transport)
        self._a3c_head.begin()

    @functools.wraps(received)
    def data_received(self: Any, data: bytes) -> None:
        head: _Head | None = getattr(self, "_a3c_head", None)
        if head is None:
            received(self, data)
        elif not head.refused:
            if head.seen is None and idle(self, head):
                head.begin()
            _feed(self, head, data, received, settle)

    @functools.wraps(lost)
    def connection_lost(self: Any, exc: Exception | None) -> None:
        head: _Head | None = getattr(self, "_a3c_head", None)
        if head is not None:
            head.cancel()
        lost(self, exc)

    cls.connection_made = connection_made
    cls.data_received = data_received
    cls.connection_lost = connection_lost


def _no_settle(protocol: Any, head: _Head) -> None:
    pass  # httptools: on_headers_complete ends the head


def _wrap_httptools(cls: type) -> None:
    # The parser calls these as it meets a message's start, its head's end, its end.
    begin, complete, done = cls.on_message_begin, cls.on_headers_complete, cls.on_message_complete

    @functools.wraps(begin)
    def on_message_begin(self: Any) -> None:
        head: _Head | None = getattr(self, "_a3c_head", None)
        if head is not None:
            head.between = False
            head.begin()
        begin(self)

    @functools.wraps(complete)
    def on_headers_complete(self: Any) -> None:
        head: _Head | None = getattr(self, "_a3c_head", None)
        if head is not None:
            head.end()
        complete(self)

    @functools.wraps(done)
    def on_message_complete(self: Any) -> None:
        done(self)
        head: _Head | None = getattr(self, "_a3c_head", None)
        if head is not None:
            head.between = True

    cls.on_message_begin = on_message_begin
    cls.on_headers_complete = on_headers_complete
    cls.on_message_complete = on_message_complete
    _wrap(cls, lambda protocol, head: head.between, _no_settle)


def _wrap_h11(cls: type) -> None:
    import h11

    # `conn`, uvicorn's h11.Connection, is made in __init__: without one (another uvicorn) every
    # head counts as complete, which bounds nothing but breaks nothing.
    def idle(protocol: Any, head: _Head) -> bool:
        conn = getattr(protocol, "conn", None)
        return conn is not None and conn.their_state is h11.IDLE

    def settle(protocol: Any, head: _Head) -> None:
        if head.seen is not None and not idle(protocol, head):
            head.end()

    def on_made(protocol: Any) -> None:
        # h11 refuses an incomplete head over its own bound (16 KiB by default) with uvicorn's
        # 400; ours decides instead, and h11's is never passed, as heads are fed up to ours.
        conn = getattr(protocol, "conn", None)
        if getattr(conn, "_max_incomplete_event_size", _bounds.max_bytes) < _bounds.max_bytes:
            conn._max_incomplete_event_size = _bounds.max_bytes  # type: ignore[union-attr]

    _wrap(cls, idle, settle, on_made)


_PROTOCOLS: dict[str, tuple[str, tuple[str, ...], Callable[[type], None]]] = {
    "uvicorn.protocols.http.httptools_impl": (
        "HttpToolsProtocol",
        ("on_message_begin", "on_headers_complete", "on_message_complete"),
        _wrap_httptools,
    ),
    "uvicorn.protocols.http.h11_impl": ("H11Protocol", (), _wrap_h11),
}
_CONNECTION_METHODS = ("connection_made", "data_received", "connection_lost")


def install(max_header_bytes: int, header_timeout_s: float) -> None:
    """Bound the request heads of every connection this process's uvicorn accepts from now on
    (the classes are wrapped the first time; later calls only change the bounds)."""
    _bounds.max_bytes, _bounds.timeout_s = max_header_bytes, header_timeout_s
    for module_name, (class_name, extra, wrap) in _PROTOCOLS.items():
        if module_name in _tried:
            continue
        _tried.add(module_name)
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):  # httptools is optional; h11 comes with uvicorn
            continue
        wanted = (*_CONNECTION_METHODS, *extra)
        missing = [name for name in wanted if not callable(getattr(cls, name, None))]
        if missing:
            _LOG.warning(
                "a3c-http: %s.%s has no %s (a uvicorn other than 0.54): its request heads are "
                "not bounded by A3C_MAX_HEADER_BYTES and A3C_HEADER_TIMEOUT_S",
                module_name,
                class_name,
                ", ".join(missing),
            )
            continue
        wrap(cls)
