"""Messages between our own processes: frames of 8 bytes (the lengths of a JSON head and of a
body, little-endian uint32), the head, the body. The push process (a3c_http/pushproc.py) speaks
them with its worker over pipes, the master's fronts (master/fronts.py) with the master over
socket pairs. Bodies are bytes as they are (tensors, replies): nothing is pickled."""

from __future__ import annotations

import json
import os
import struct
from contextlib import suppress
from typing import Any

LENGTHS = struct.Struct("<II")


def frame(head: dict[str, Any], body: bytes = b"") -> bytes:
    return b"".join(frame_parts(head, body))


def frame_parts(head: dict[str, Any], body: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """A frame's lengths, head and body, for a writer that takes them apart (writelines): the
    body is not copied into one buffer with them."""
    encoded = json.dumps(head).encode()
    return LENGTHS.pack(len(encoded), len(body)), encoded, body


def write_frame(fd: int, head: dict[str, Any], body: bytes = b"") -> None:
    """Write one frame to a file descriptor (a pipe), whole: in one system call where the pipe
    has room, and without first joining its parts (a body is a model's size)."""
    encoded = json.dumps(head).encode()
    parts = [LENGTHS.pack(len(encoded), len(body)), encoded, body]
    written = os.writev(fd, parts)
    if written < sum(map(len, parts)):  # a full pipe: the rest as it drains
        view = memoryview(b"".join(parts))[written:]
        while view:
            view = view[os.write(fd, view) :]


def widen_pipe(fd: int, size: int = 1 << 20) -> None:
    """Let a pipe hold `size` bytes (Linux; at most /proc/sys/fs/pipe-max-size) instead of 64 KiB,
    so that a frame of a model's size is written and read in one go rather than in slices as the
    other end drains it. Elsewhere, or refused, the pipe stays as it is."""
    with suppress(ImportError, AttributeError, OSError):
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)


class Frames:
    """Frames out of the bytes of a pipe or a socket, as they arrive. `writable`: each body is a
    bytearray of its own, which a decoder may take as a tensor's memory (a3c_http/wire.py
    `Layout.decode`) rather than copy again; else bytes."""

    def __init__(self, writable: bool = False) -> None:
        self._buffer = bytearray()
        self._body = bytearray if writable else bytes

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= LENGTHS.size:
            head_len, body_len = LENGTHS.unpack_from(self._buffer)
            end = LENGTHS.size + head_len + body_len
            if len(self._buffer) < end:
                break
            with memoryview(self._buffer) as view:  # one copy of the body, not two
                head = json.loads(bytes(view[LENGTHS.size : end - body_len]))
                frames.append((head, self._body(view[end - body_len : end])))
            del self._buffer[:end]
        return frames
