"""One send for a message's head and body, at both ends of a push.

uvicorn writes a response's head and its body to the socket one after the other, and httpcore a
request's head and its body: two TCP segments a message, each a wake-up of the peer (figures:
docs/performance.md, "The parameter server", "one send").

- Served (`HeldTransport`, which a3c_http/tuning/ gives every connection uvicorn accepts):
  the transport uvicorn's protocol writes to holds what is written in one turn of the event loop and
  sends it together at the end of the turn, or at once when it passes `HOLD_BYTES` (a large body is
  not copied to be joined: the event loop's `writelines` sends the parts as they are).
- Sent (`HeldWrites`, the streams of a3c_http/net/outbound.py's network backend): what httpcore
  writes is held until it reads the reply, and sent in one write when it is under `HOLD_BYTES`.

Both are used only where a3c_http/tuning/'s switch, A3C_TUNING, is on.

Nothing else changes: the bytes and their order are the same, a connection that closes still sends
what it was given first, and no write waits longer than the turn of the loop (served) or the
read that follows it (sent).
"""

from __future__ import annotations

import asyncio
from typing import Any

# Larger writes go out at once (with what is held before them): joining them would cost a copy
# of the body for a segment saved.
HOLD_BYTES = 256 * 1024


class HeldTransport(asyncio.Transport):
    """An asyncio transport whose writes of one loop turn leave in one send."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport
        self._held: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            if len(data) >= HOLD_BYTES:
                self._transport.write(data)
                return
            asyncio.get_running_loop().call_soon(self.flush)
        self._held.append(bytes(data) if isinstance(data, memoryview) else data)
        self._size += len(data)
        if self._size >= HOLD_BYTES:
            self.flush()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        held, self._held, size, self._size = self._held, [], self._size, 0
        if not held or self._transport.is_closing():
            return
        if len(held) == 1:
            self._transport.write(held[0])
        elif size < HOLD_BYTES:
            self._transport.write(b"".join(held))
        else:
            self._transport.writelines(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held, self._size = [], 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    # The rest is the transport's own.
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class HeldWrites:
    """The writes of a request, held until its reply is read: `hold` them, `take` them joined."""

    __slots__ = ("_held", "_size")

    def __init__(self) -> None:
        self._held: list[bytes] = []
        self._size = 0

    def hold(self, data: bytes) -> bool:
        """Keep `data` (True), or say it is too large to be held (False: send what `take` gives,
        then it)."""
        if self._size + len(data) >= HOLD_BYTES:
            return False
        if data:
            self._held.append(data)
            self._size += len(data)
        return True

    def take(self) -> bytes:
        held, self._held, self._size = self._held, [], 0
        return held[0] if len(held) == 1 else b"".join(held)
