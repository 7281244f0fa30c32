"""Frames between our own processes (a3c_http/frames.py): whole whatever the pipe holds."""

from __future__ import annotations

import fcntl
import os
import threading

from a3c_http.frames import Frames, frame, widen_pipe, write_frame


def test_a_frame_larger_than_the_pipe_arrives_whole_and_in_order() -> None:
    read_end, write_end = os.pipe()
    body = bytes(range(256)) * 1200  # 300 KB: the rest of a first writev waits for the reader
    writer = threading.Thread(
        target=lambda: [write_frame(write_end, {"n": n}, body[n:]) for n in range(3)]
    )
    writer.start()
    frames, got = Frames(), []
    while len(got) < 3:
        got += frames.feed(os.read(read_end, 1 << 16))
    writer.join()
    os.close(read_end)
    os.close(write_end)
    assert got == [({"n": n}, body[n:]) for n in range(3)]


def test_a_widened_pipe_holds_a_megabyte() -> None:
    read_end, write_end = os.pipe()
    try:
        widen_pipe(write_end)
        assert fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ) >= 1 << 20
    finally:
        os.close(read_end)
        os.close(write_end)


def test_writable_bodies_are_each_their_own_memory() -> None:
    """A writable body may become a tensor's memory (the master's fronts' channel): what the
    reader does to it, and what arrives after it, change no other frame's body."""
    frames = Frames(writable=True)
    first, second = frame({"n": 0}, b"a" * 64), frame({"n": 1}, b"b" * 64)
    (_, body0), = frames.feed(first + second[:10])
    assert isinstance(body0, bytearray)
    body0[:] = b"z" * 64
    (_, body1), = frames.feed(second[10:])
    assert body1 == b"b" * 64 and frames.feed(first) == [({"n": 0}, bytearray(b"a" * 64))]
