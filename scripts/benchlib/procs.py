"""The benchmarks' processes: signals that end a benchmark with every process it started ended
(by pid, in the clusters' `finally`), and where the processes run on a host (its cores, the
default numbers of workers, and taskset's core lists for `scale --pin`)."""

from __future__ import annotations

import os
import signal


def interrupt(signum: int, frame: object) -> None:
    """A signal handler that raises KeyboardInterrupt, once only: the cleanup that follows (every
    process ended by its pid) must run to its end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def end_on_signals() -> None:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt (`interrupt`)."""
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def host_cores() -> list[int]:
    """The cores this process may run on (a container's share, not the machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def default_workers(cores: int) -> list[int]:
    """Powers of two up to `cores` - 1, and `cores` - 1 itself: the master is counted as a core
    of its own, and a host full of workers is the row the scaling bar reads (16 cores: 1, 2, 4,
    8 and 15)."""
    out = [1]
    while out[-1] * 2 <= cores - 1:
        out.append(out[-1] * 2)
    return out if cores - 1 <= out[-1] else [*out, cores - 1]


def pin_sets(workers: int, cores: list[int]) -> list[str]:
    """taskset's core lists for the master and then each of `workers` workers: the master the
    first core, each worker one of the others, around again past the last (over all cores when
    there is no other)."""
    rest = cores[1:] or cores
    return [str(cores[0]), *(str(rest[i % len(rest)]) for i in range(workers))]


def receivers_cores(cores: list[int]) -> set[int]:
    """Where pinned receivers run: on the workers' cores, among them (the kernel places them), so
    that the master keeps its core to itself and a host full of workers stays full (15 workers
    and the master on 16 cores, the row the scaling bar reads, with the receivers' work shared
    among them)."""
    return set(cores[1:] or cores)
