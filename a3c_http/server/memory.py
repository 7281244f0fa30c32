"""Large buffers without page faults: glibc's malloc told to keep freed memory for the next push.

Every gradient push of a large model allocates several buffers of the model's size (the body,
its decoded vector, the new weights and their bytes) and frees them when it is answered. glibc
gives an allocation above its mmap threshold (128 KiB at first) pages of its own and returns them
to the system when it is freed, so the next push of a 4 MB model touches about a thousand fresh
pages again: measured in one master process on this project's 2-core machine, 300 to 1,200 page
faults and 1.5 to 2.5 ms of CPU a push of the million-parameter model, against 0 and none with
the settings below (`ru_minflt`, `time.process_time`; 2.4 ms of CPU a push in all, against 3.9
to 4.8). Raising the mmap threshold serves such allocations from malloc's heap, and raising the
trim threshold keeps the freed ones there for the next push; what stays mapped is bounded by the
largest body a service takes (A3C_MAX_BODY_BYTES) times the few buffers a push holds at once.

Other C libraries (musl, macOS) have no mallopt or other knobs; there this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc refuses a larger mmap threshold on 64-bit systems (half its heaps' maximum size).
_MAX_MMAP_THRESHOLD = 32 * 1024 * 1024


def keep_freed_memory(largest: int) -> bool:
    """Ask glibc's malloc to serve allocations of up to `largest` bytes (at most 32 MiB) from its
    heap and to keep up to four times that freed at the heap's top instead of returning it to the
    system. True when glibc took both settings."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    threshold = min(max(largest, 128 * 1024), _MAX_MMAP_THRESHOLD)
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, 4 * threshold)
    )
