"""Frames between our own processes (a3c_http/wire/frames.py): whole whatever the pipe holds."""

from __future__ import annotations

import fcntl
import itertools
import os
import threading

from a3c_http.wire.frames import FrameReader, Frames, frame, widen_pipe, write_frame

# What heads carry: numbers, None, nested lists, text beyond ASCII; and a lone surrogate (an
# exception's message can hold one), which the fast codec refuses both ways.
HEADS = [
    {"id": 7, "status": 200, "headers": [["x-loss", "1.5"]], "timeout": 0.25, "run_id": None},
    {"error": "unavailable", "message": "d\u00e9j\u00e0 vu \u2013 \x00", "nan": float("nan")},
    {"error": "unavailable", "message": "a lone \ud800 surrogate"},
]


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


def test_every_head_comes_back_as_it_went() -> None:
    got = Frames().feed(b"".join(frame(head, b"body") for head in HEADS))
    assert [body for _, body in got] == [b"body"] * len(HEADS)
    assert repr([head for head, _ in got]) == repr(HEADS)  # repr: nan == nan


def test_a_widened_pipe_holds_a_megabyte() -> None:
    read_end, write_end = os.pipe()
    try:
        widen_pipe(write_end)
        assert fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ) >= 1 << 20
    finally:
        os.close(read_end)
        os.close(write_end)



def test_a_frame_reader_gives_every_frame_whole_and_in_order_however_the_reads_fall() -> None:
    """Small frames are staged, bodies of `direct_bytes` or more read into their own memory
    (the master's receivers' channel), whatever the sizes of the reads that bring them; a staged
    frame larger than the staging buffer grows it."""
    bodies = [b"", b"s" * 10, bytes(range(256)) * 300, b"t" * 5, b"L" * 300_000, b"e" * 1024]
    stream = b"".join(frame({"n": n}, body) for n, body in enumerate(bodies))
    sizes = [(4096, 1024), (16, 10**9)]  # (staging buffer, direct_bytes)
    for (stage, direct), reads in itertools.product(sizes, ([1, 7, 3], [65_536], [8, 200_000])):
        reader, got, at, i = FrameReader(stage, direct), [], 0, 0
        while at < len(stream):
            room = reader.buffer()
            n = min(len(room), reads[i % len(reads)], len(stream) - at)
            room[:n] = stream[at : at + n]
            room.release()
            got += reader.filled(n)
            at, i = at + n, i + 1
        assert got == [({"n": n}, body) for n, body in enumerate(bodies)], reads
        assert all(isinstance(body, bytearray) for _, body in got)
