"""One send for a message's head and body (a3c_http/server/coalesce.py): the transport uvicorn's
protocols write to, and the streams of our outbound calls (a3c_http/net/outbound.py). That the bytes
still make valid HTTP is what every test through a real uvicorn or httpx shows."""

from __future__ import annotations

import asyncio
from typing import Any

import httpcore

from a3c_http.net.outbound import _SlicedStream
from a3c_http.server.coalesce import HOLD_BYTES, HeldTransport


class Recording(asyncio.Transport):
    """A transport (or an httpcore stream) that records what is done to it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: Any, timeout: float | None = None) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, list_of_data: Any) -> None:
        self.calls.append(("writelines", [bytes(d) for d in list_of_data]))

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.calls.append(("read", max_bytes))
        return b"HTTP/1.1 200 OK\r\n"

    def close(self) -> None:
        self.calls.append(("close", None))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", None))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"
LARGE = b"x" * HOLD_BYTES


def served(*steps: str) -> list[tuple[str, Any]]:
    """What reaches the socket's transport when uvicorn's protocol does `steps` to a
    HeldTransport, one turn of the event loop, then lets the loop turn once more."""

    async def run() -> list[tuple[str, Any]]:
        raw = Recording()
        held = HeldTransport(raw)
        for step in steps:
            if step == "head":
                held.write(HEAD)
            elif step == "body":
                held.write(memoryview(b"hello"))
            elif step == "large":
                held.write(LARGE)
            else:
                getattr(held, step)()
        await asyncio.sleep(0)  # the turn's end: what is held is sent
        return raw.calls

    return asyncio.run(run())


def test_a_response_written_in_one_turn_leaves_in_one_send() -> None:
    assert served("head", "body") == [("write", HEAD + b"hello")]


def test_a_large_body_is_sent_with_the_head_but_never_joined_to_it() -> None:
    assert served("head", "large") == [("writelines", [HEAD, LARGE])]
    assert served("large") == [("write", LARGE)]


def test_a_closing_connection_sends_what_it_holds_first_and_an_abort_drops_it() -> None:
    assert served("head", "body", "close") == [("write", HEAD + b"hello"), ("close", None)]
    assert served("head", "abort") == [("abort", None)]


def test_a_request_leaves_in_one_send_when_its_reply_is_read() -> None:
    raw = Recording()
    stream = _SlicedStream(raw)  # type: ignore[arg-type]  # a stream of httpcore's kind
    stream.write(b"POST /gradients HTTP/1.1\r\n\r\n")
    stream.write(b"body")
    stream.write(b"")  # h11's end of a body of known length
    assert raw.calls == []
    stream.read(4096)
    assert raw.calls == [("write", b"POST /gradients HTTP/1.1\r\n\r\nbody"), ("read", 4096)]


def test_a_request_too_large_to_hold_goes_out_as_it_comes() -> None:
    raw = Recording()
    stream = _SlicedStream(raw)  # type: ignore[arg-type]
    stream.write(b"POST / HTTP/1.1\r\n\r\n")
    stream.write(LARGE)
    assert raw.calls == [("write", b"POST / HTTP/1.1\r\n\r\n"), ("write", LARGE)]
    stream.write(b"tail")
    stream.close()  # a request whose reply is never read: the tail is dropped
    assert raw.calls[2:] == [("close", None)]
    assert isinstance(stream, httpcore.NetworkStream)
