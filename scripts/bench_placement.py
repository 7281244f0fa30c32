"""Where `scripts/bench_scale.py`'s processes run on a host: its cores, the default numbers of
workers, and the cluster pinned core by core with taskset (`--pin`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from a3c_http.testing.localcluster import LocalCluster
from scripts.bench_steps import local_cluster


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


def fronts_cores(cores: list[int]) -> set[int]:
    """Where pinned fronts run: on the workers' cores, among them (the kernel places them), so
    that the master keeps its core to itself and a host full of workers stays full (15 workers
    and the master on 16 cores, the row the scaling bar reads, with the fronts' work shared
    among them)."""
    return set(cores[1:] or cores)


@contextlib.contextmanager
def cluster_of(n: int, pin: list[str] | None, cores: list[int]) -> Iterator[LocalCluster]:
    """bench_steps's `local_cluster` of `n` workers, pinned as `pin` says (`pin_sets`), and the
    master's fronts, if it has any, moved to `fronts_cores` once they run (they start on the
    master's core, which they inherit; one the master starts again later stays there)."""
    with local_cluster(n, pin) as cluster:
        if pin:
            for pid in (cluster.status().get("fronts") or {}).get("pids", []):
                os.sched_setaffinity(pid, fronts_cores(cores))
        yield cluster
