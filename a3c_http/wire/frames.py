"""Messages between our own processes: frames of 8 bytes (the lengths of a JSON head and of a
body, little-endian uint32), the head, the body. The push process (a3c_http/net/push_process.py)
speaks them with its worker over pipes, the master's receivers (master/ingress/receivers.py) with
the master over socket pairs. Bodies are bytes as they are (tensors, replies): nothing is pickled.

Heads are JSON, written and read by pydantic's Rust codec (`pydantic_core.to_json`, `from_json`),
about 4x faster than the `json` module on every push through a receiver (docs/performance.md). What
that codec refuses, a string with a lone
surrogate (an exception's message can hold one), goes through the `json` module instead."""

from __future__ import annotations

import json
import os
import struct
from contextlib import suppress
from typing import Any

from pydantic_core import PydanticSerializationError, from_json, to_json

LENGTHS = struct.Struct("<II")


def frame(head: dict[str, Any], body: bytes = b"") -> bytes:
    """One frame in one buffer (tests build streams of them; writers take `frame_parts`)."""
    return b"".join(frame_parts(head, body))


def frame_parts(head: dict[str, Any], body: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """A frame's lengths, head and body, for a writer that takes them apart (writelines): the
    body is not copied into one buffer with them."""
    encoded = encode_head(head)
    return LENGTHS.pack(len(encoded), len(body)), encoded, body


def encode_head(head: dict[str, Any]) -> bytes:
    """A frame's head as JSON (the module's docstring)."""
    try:
        return to_json(head)
    except PydanticSerializationError:
        return json.dumps(head).encode()


def decode_head(data: bytes | bytearray) -> dict[str, Any]:
    """A frame's head from its JSON, as `json.loads` reads it (the module's docstring)."""
    try:
        return from_json(data)
    except ValueError:
        return json.loads(data)


def write_frame(fd: int, head: dict[str, Any], body: bytes = b"") -> None:
    """Write one frame to a file descriptor (a pipe), whole: in one system call where the pipe
    has room, and without first joining its parts (a body is a model's size)."""
    parts = frame_parts(head, body)
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
    """Frames out of the bytes of a pipe or a socket, as they arrive."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= LENGTHS.size:
            head_len, body_len = LENGTHS.unpack_from(self._buffer)
            end = LENGTHS.size + head_len + body_len
            if len(self._buffer) < end:
                break
            with memoryview(self._buffer) as view:  # one copy of the body, not two
                head = decode_head(bytes(view[LENGTHS.size : end - body_len]))
                frames.append((head, bytes(view[end - body_len : end])))
            del self._buffer[:end]
        return frames


class FrameReader:
    """Frames read straight into their memory, for an asyncio `BufferedProtocol` (the master's
    end of its receivers' channels, master/ingress/receivers.py): the loop asks `buffer()` where to
    put what it reads and says with `filled(n)` how much it put there, which returns the frames that
    completed. Heads and small bodies land in a staging buffer and are copied out of it; a body of
    `direct_bytes` or more gets a bytearray of its own, and the rest of it is read into that
    bytearray itself. So a model's body, 4 MB for a million parameters, crosses from the socket to
    the gradient vector in the kernel's one copy, where `Frames` appends each read to its buffer and
    copies the body out of it again. Bodies are bytearrays, each its own memory, which a decoder may
    take as a tensor's (a3c_http/wire/tensors.py `Layout.decode`)."""

    def __init__(self, stage_bytes: int = 256 * 1024, direct_bytes: int = 64 * 1024) -> None:
        self._stage = bytearray(stage_bytes)
        self._fill = 0  # bytes of the staging buffer in use
        self._direct_bytes = direct_bytes
        self._head: dict[str, Any] | None = None  # the frame whose body is read directly
        self._body: bytearray | None = None
        self._got = 0  # bytes of that body read

    def buffer(self) -> memoryview:
        """Where the next read goes: the rest of a direct body, or the staging buffer's room."""
        if self._body is not None:
            return memoryview(self._body)[self._got :]
        if self._fill == len(self._stage):  # a frame larger than the room it was given
            self._stage.extend(bytes(len(self._stage)))
        return memoryview(self._stage)[self._fill :]

    def filled(self, n: int) -> list[tuple[dict[str, Any], bytearray]]:
        """`n` bytes were read into the last `buffer()`: the frames they completed."""
        if self._body is not None:
            self._got += n
            if self._got < len(self._body):
                return []
            assert self._head is not None
            frames = [(self._head, self._body)]
            self._head = self._body = None
            return frames
        self._fill += n
        frames = []
        stage, fill, start = self._stage, self._fill, 0
        while fill - start >= LENGTHS.size:
            head_len, body_len = LENGTHS.unpack_from(stage, start)
            body_at = start + LENGTHS.size + head_len
            end = body_at + body_len
            if fill < body_at or (fill < end and body_len < self._direct_bytes):
                break  # the head, or the rest of a staged body, is not in yet
            head = decode_head(stage[start + LENGTHS.size : body_at])  # a slice: its own copy
            if fill >= end:
                frames.append((head, stage[body_at:end]))
                start = end
                continue
            # The rest of this body goes straight to memory of its own.
            self._head, self._body, self._got = head, bytearray(body_len), fill - body_at
            self._body[: self._got] = stage[body_at:fill]
            start = fill
            break
        if start:  # what is left moves to the front
            stage[: fill - start] = stage[start:fill]
        self._fill = fill - start
        return frames
