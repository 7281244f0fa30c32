"""What the master host must have for a run's learner beside it: the device its config names
(`resolve_device`) and room in shared memory for the learner's rollout slots and weights
(`check_shared_memory`), both checked at `POST /train` before anything changes; how its
threads wait (`spinning_threads`); and how the master's children start (`child_context`)."""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import threading
from collections.abc import Iterator, Mapping
from multiprocessing import forkserver
from multiprocessing.context import BaseContext

import torch

from a3c_http.wire.named_tensors import Expected

log = logging.getLogger("a3c.master.learner")

class DeviceUnavailable(ValueError):
    """The config's `device` is not on this host."""


def resolve_device(name: str) -> torch.device:
    """The torch device `device` names on this host; DeviceUnavailable when it has none such."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(f"device {name!r}: torch sees no CUDA GPU on the master host")
        if device.index is not None and device.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise DeviceUnavailable(f"device {name!r}: the master host has {count} CUDA GPUs")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceUnavailable(f"device {name!r}: torch sees no MPS device on the master host")
    return device



class SharedMemoryShort(ValueError):
    """The host's shared memory cannot hold the learner's slots."""


SHM_DIR = "/dev/shm"


def slots_bytes(expected: Mapping[str, Expected], capacity: int) -> int:
    """The shared memory `capacity` slots of rollouts holding `expected` take."""
    return capacity * sum(
        math.prod(e.shape) * torch.empty((), dtype=e.dtypes[0]).element_size()
        for e in expected.values()
    )


def check_shared_memory(
    expected: Mapping[str, Expected], capacity: int, weights_bytes: int = 0
) -> None:
    """SharedMemoryShort when SHM_DIR (where torch puts shared tensors on Linux) has less room
    than the slots and the shared weights need: writing past its end would kill the master
    (SIGBUS), not raise."""
    try:
        room = os.statvfs(SHM_DIR)
    except OSError:  # no such folder (not Linux): nothing to measure
        return
    free = room.f_bavail * room.f_frsize
    need = slots_bytes(expected, capacity) + weights_bytes
    if need > free:
        raise SharedMemoryShort(
            f"the learner's {capacity} rollout slots (queue_capacity, twice queue_size) and "
            "its weights take "
            f"{need / 2**20:.0f} MiB of shared memory, and {SHM_DIR} on the master host has "
            f"{free / 2**20:.0f} MiB free: give the master more (docker run --shm-size, compose "
            "shm_size, a Memory emptyDir at /dev/shm on Kubernetes), or make rollouts smaller "
            "(num_envs, t_max) or fewer (queue_size)"
        )


@contextlib.contextmanager
def spinning_threads() -> Iterator[None]:
    """A learner process started meanwhile keeps its threads spinning between operations
    (OpenMP's OMP_WAIT_POLICY=ACTIVE, read as PyTorch loads), unless this process's environment
    says otherwise: a step of many small operations on several threads otherwise waits for them
    to wake at each (SAC on Pendulum, a learner of 2 threads beside 2 workers: 4,029 env steps in
    39.5 s spinning, 57.8 s not). A learner of one thread has none to wake. The price: the
    threads spin while the learner waits for rollouts too (a core each, taken from workers on
    the same host), and on a host busier than its cores they wait for each other instead (a SAC
    step of 32-unit layers beside a busy core: 76 ms on 2 threads, 0.55 ms on one): there, set
    `learner_threads` 1, or OMP_WAIT_POLICY=PASSIVE in the master's environment."""
    if "OMP_WAIT_POLICY" in os.environ:
        yield
        return
    os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    try:
        yield
    finally:
        os.environ.pop("OMP_WAIT_POLICY", None)


# What a child of the master imports before it runs: the fork server imports it once.
# (A parameter-server shard imports its server, 0.2 s, as it starts: few runs have shards, and
# every fork server would pay for it.)
CHILD_MODULES = ["torch", "master.learning.learner_loop", "a3c_http.policy.evaluation"]
_fork_server = threading.Lock()


def child_context() -> BaseContext:
    """The context the master starts its children in (the learner, the evaluation process): a
    fork server of its own, started at the first child with CHILD_MODULES imported and under
    `spinning_threads` (OpenMP reads its wait policy as torch loads), from which each child
    forks with its imports done (a "spawn" child imports them again: about 1.5 s of CPU each).
    A child forks from a process that never ran a thread of the master's, as a spawned one
    starts from none; a child still gets its work (config, weights) as its arguments, and
    reads nothing of the master's environment that changed after the server started. Where no
    fork server can start (no fork; no writable temporary folder for its socket), "spawn"."""
    try:
        context = multiprocessing.get_context("forkserver")
    except ValueError:  # a platform without fork
        return multiprocessing.get_context("spawn")
    with _fork_server:
        context.set_forkserver_preload(CHILD_MODULES)
        try:
            with spinning_threads():
                forkserver.ensure_running()
        except OSError as exc:
            log.warning("no fork server for the learner (%s): it is spawned", exc)
            return multiprocessing.get_context("spawn")
    return context

