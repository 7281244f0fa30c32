"""The bounds on a request's head that uvicorn does not set (a3c_http/server/headbounds.py holds
the bounds and the head's state): uvicorn calls the app only once a head is complete, so the
methods of its protocol classes are wrapped here, behind the switch of a3c_http/tuning."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from a3c_http.server.headbounds import Head, bounds, feed
from a3c_http.tuning import _fall_back, _uvicorn_classes, enabled, installed

_heads_tried: set[str] = set()  # classes wrapped, or found lacking, in this process


def _wrap(
    cls: type,
    idle: Callable[[Any, Head], bool],
    settle: Callable[[Any, Head], None],
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
        self._a3c_head = Head(self, transport)
        self._a3c_head.begin()

    @functools.wraps(received)
    def data_received(self: Any, data: bytes) -> None:
        head: Head | None = getattr(self, "_a3c_head", None)
        if head is None:
            received(self, data)
        elif not head.refused:
            if head.seen is None and idle(self, head):
                head.begin()
            feed(self, head, data, received, settle)

    @functools.wraps(lost)
    def connection_lost(self: Any, exc: Exception | None) -> None:
        head: Head | None = getattr(self, "_a3c_head", None)
        if head is not None:
            head.cancel()
        lost(self, exc)

    cls.connection_made = connection_made
    cls.data_received = data_received
    cls.connection_lost = connection_lost


def _wrap_httptools(cls: type) -> None:
    # The parser calls these as it meets a message's start, its head's end, its end.
    begin, complete, done = cls.on_message_begin, cls.on_headers_complete, cls.on_message_complete

    @functools.wraps(begin)
    def on_message_begin(self: Any) -> None:
        head: Head | None = getattr(self, "_a3c_head", None)
        if head is not None:
            head.between = False
            head.begin()
        begin(self)

    @functools.wraps(complete)
    def on_headers_complete(self: Any) -> None:
        head: Head | None = getattr(self, "_a3c_head", None)
        if head is not None:
            head.end()
        complete(self)

    @functools.wraps(done)
    def on_message_complete(self: Any) -> None:
        done(self)
        head: Head | None = getattr(self, "_a3c_head", None)
        if head is not None:
            head.between = True

    cls.on_message_begin = on_message_begin
    cls.on_headers_complete = on_headers_complete
    cls.on_message_complete = on_message_complete
    # on_headers_complete ends the head: nothing to settle after the data
    _wrap(cls, lambda protocol, head: head.between, lambda protocol, head: None)


def _wrap_h11(cls: type) -> None:
    import h11

    # `conn`, uvicorn's h11.Connection, is made in __init__: without one (another uvicorn) every
    # head counts as complete, which bounds nothing but breaks nothing.
    def idle(protocol: Any, head: Head) -> bool:
        conn = getattr(protocol, "conn", None)
        return conn is not None and conn.their_state is h11.IDLE

    def settle(protocol: Any, head: Head) -> None:
        if head.seen is not None and not idle(protocol, head):
            head.end()

    def on_made(protocol: Any) -> None:
        # h11 refuses an incomplete head over its own bound (16 KiB by default) with uvicorn's
        # 400; ours decides instead, and h11's is never passed, as heads are fed up to ours.
        conn = getattr(protocol, "conn", None)
        if getattr(conn, "_max_incomplete_event_size", bounds.max_bytes) < bounds.max_bytes:
            conn._max_incomplete_event_size = bounds.max_bytes  # type: ignore[union-attr]

    _wrap(cls, idle, settle, on_made)


HEAD_PROTOCOLS: dict[str, tuple[str, tuple[str, ...], Callable[[type], None]]] = {
    "uvicorn.protocols.http.httptools_impl": (
        "HttpToolsProtocol",
        ("on_message_begin", "on_headers_complete", "on_message_complete"),
        _wrap_httptools,
    ),
    "uvicorn.protocols.http.h11_impl": ("H11Protocol", (), _wrap_h11),
}
CONNECTION_METHODS = ("connection_made", "data_received", "connection_lost")


def bound_request_heads(max_header_bytes: int, header_timeout_s: float) -> None:
    """Bound the request heads of every connection this process's uvicorn accepts from now on
    (a3c_http/server/headbounds.py: A3C_MAX_HEADER_BYTES and A3C_HEADER_TIMEOUT_S). uvicorn calls
    the app only once a head is complete and picks its protocol class before it imports the app,
    so this wraps methods of the classes themselves (`HEAD_PROTOCOLS`), once per process; later
    calls only change the bounds. A class that lacks a method this wraps is left as it is, with a
    warning."""
    bounds.max_bytes, bounds.timeout_s = max_header_bytes, header_timeout_s
    if not enabled():
        return
    classes = {module: class_name for module, (class_name, _, _) in HEAD_PROTOCOLS.items()}
    for name, cls in _uvicorn_classes(_heads_tried, classes):
        _, extra, wrap = HEAD_PROTOCOLS[name.rpartition(".")[0]]
        wanted = (*CONNECTION_METHODS, *extra)
        missing = [method for method in wanted if not callable(getattr(cls, method, None))]
        if missing:
            _fall_back(
                f"the bounds on request heads ({name})",
                f"it has no {', '.join(missing)}: A3C_MAX_HEADER_BYTES and A3C_HEADER_TIMEOUT_S "
                "are not enforced",
            )
            continue
        wrap(cls)
        installed.add(f"{name} request-head bounds")
