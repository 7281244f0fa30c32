"""The learner beside the master (`algo` ppo, impala and apex): a process of its own that takes
the workers' rollouts from a bounded queue, runs the algorithm's update on the CPU or a GPU, and
publishes each new version of the weights, so the HTTP side never waits on a step.

The learner and the master share the newest weights: one float32 vector in shared memory and
its version, written by the learner after each update and read by the master when the update's
message comes, under one lock between the two processes (so neither reads half an update; a
process killed while it holds the lock is noticed by the other, which stops waiting for it).

`LearnerProcess` is the master's end. `POST /experience` (master/ingress/updates.py) reserves a
slot (`reserve`: at most `queue_capacity` rollouts wait, twice `queue_size`; beyond that the reply
is held until there is room, or refused with 503 after `hold_s`: the seed's bounded queue), then
hands the rollout it checked and decoded over (`submit`): its tensors are copied into the slot, one
of `queue_capacity` preallocated in shared memory when the learner starts (a rollout's shapes are
the run's), and only the slot's number crosses to the learner, which reads the tensors there and
frees the slot once it learnt from them. A body is decoded once, and nothing of a rollout is
pickled. A thread reads what the learner sends back: each update's weights (from the shared vector),
metrics, counts and new target network (Ape-X's) go to the parameter server (`publish`), which
serves and saves them; the optimizer's state comes at most every `optimizer_every_s` seconds (what
the run folder keeps of it is that old at most), and with the last update when the learner stops.

With `learners` N the learner is a team (master/learning/learner_team.py) whose first process this
end talks to; one of them that ends is the team's failure, and it is started again as one learner.
The process itself is master/learning/learner_loop.py; what the master host must have for it (the
device, room in shared memory), master/learning/learner_needs.py. The master starts the learner
again from the newest weights it published when it fails (master/learner_runs.py), and ends the run
only after MAX_FAILURES_IN_A_ROW failures with no update between them.
"""
from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from a3c_http.algos.registry import algorithm_class
from a3c_http.config.training import TrainConfig
from a3c_http.wire.named_tensors import Expected
from a3c_http.wire.protocol import EXPERIENCE_HOLD_S
from master.learning.learner_loop import PeerGone, Publication, Start, holding
from master.learning.learner_needs import child_context, resolve_device, spinning_threads
from master.learning.learner_team import end_team, start_team, team_ended, team_pids

log = logging.getLogger("a3c.master")

STOP_WAIT_S = 10.0  # how long a stopping learner may take to send its last weights
# A learner that fails this many times with no update in between ends the run: it would only
# fail again (a device that is gone, a bug), where one failure is started again.
MAX_FAILURES_IN_A_ROW = 3


class LearnerBusy(Exception):
    """No room in the learner's queue within the hold time."""


class WouldWait(Exception):
    """A push asked not to wait (taken on the event loop) would wait for the learner: nothing
    was taken, and it is to be taken again where it may wait."""


class LearnerProcess:
    def __init__(
        self,
        publish: Callable[[int, torch.Tensor, Publication], None],
        failed: Callable[[str], None],
        optimizer_every_s: float,
        hold_s: float = EXPERIENCE_HOLD_S,
    ) -> None:
        """`publish` takes each publication (the parameter server's); `failed` the learner's
        error when it ends on one (from the thread that reads the learner: the process is gone,
        and `start` may be called from there)."""
        self._publish = publish
        self._failed = failed
        self.optimizer_every_s = optimizer_every_s
        self.hold_s = hold_s
        # A leaf lock: nothing outside this object is called while it is held (the callbacks
        # `reserve` and `submit` take are called between waits, with it released).
        self._cond = threading.Condition()
        # Held by start and stop: a learner started while another call stops one is stopped
        # after it, never left running. Taken before `_cond`, never while it is held.
        self.lifecycle = threading.RLock()
        self._process: Any = None  # the first learner (the only one, unless `learners`)
        self._followers: list[Any] = []  # the others of its team, which it leads
        self._inbox: Any = None
        self._reader: threading.Thread | None = None
        self._capacity = 0
        self._batch = 0  # rollouts an update takes
        self._waits_for_update = False
        # The slots, one tensor per name of a rollout with `capacity` rows in shared memory;
        # those no rollout holds, and those reserved by a push not yet submitted (the others
        # are in the learner's queue).
        self._slots: dict[str, torch.Tensor] = {}
        self._free: list[int] = []
        self._reserved: set[int] = set()
        # The newest weights, their version and the lock both processes take around them.
        self._shared: torch.Tensor | None = None
        self._shared_version: Any = None
        self._shared_lock: Any = None
        self.device: str | None = None
        self.updates = 0
        self.used = 0
        self.dropped_stale = 0
        self.nonfinite_steps = 0
        self.metrics: dict[str, float] = {}
        self.error: str | None = None  # why the last learner of this run failed
        self.restarts = 0  # learners of this run started again after a failure
        self.failures_in_a_row = 0  # failures since the last published update
        self._stopping = False
        self._ready = False  # the process has built its learner and reads its inbox

    @property
    def running(self) -> bool:
        return self._process is not None

    def start(
        self,
        config: TrainConfig,
        weights: torch.Tensor,
        optimizer_state: dict[str, Any] | None,
        version: int,
        target: tuple[torch.Tensor, int] | None = None,
        *,
        expected: Mapping[str, Expected],
        restart: bool = False,
    ) -> None:
        """Start the learner of a run from these weights, optimizer state and version (a new
        run's, a resumed one's, or with `restart` the newest of one whose learner failed: its
        counters and metrics go on), and the target network (with its version) to go on from;
        its rollouts hold `expected` (the slots' shapes; a restart keeps the slots). The device
        is checked before (DeviceUnavailable)."""
        with self.lifecycle:
            self._start(config, weights, optimizer_state, version, target, restart, expected)

    def _start(
        self,
        config: TrainConfig,
        weights: torch.Tensor,
        optimizer_state: dict[str, Any] | None,
        version: int,
        target: tuple[torch.Tensor, int] | None,
        restart: bool,
        expected: Mapping[str, Expected],
    ) -> None:
        self.stop()
        device = resolve_device(config.device)
        learner = algorithm_class(config).learner
        capacity = learner.queue_capacity(config)
        if not (restart and self._slots):  # a restart keeps them; the caller checked the room
            self._slots = {
                name: torch.empty((capacity, *e.shape), dtype=e.dtypes[0]).share_memory_()
                for name, e in expected.items()
            }
        context = child_context()
        inbox, outbox = context.Queue(), context.Queue()
        self._shared = weights.detach().to("cpu", torch.float32, copy=True).share_memory_()
        # The version is read and written under the weights' lock only: a lock of its own (a
        # Value's default) would be a second one that a killed process could leave held.
        self._shared_lock = context.Lock()
        self._shared_version = context.Value("q", version, lock=False)
        start = Start(config.model_dump_json(), self._shared, optimizer_state, version,
                      str(device), self.optimizer_every_s, target, self._slots,
                      self._shared_version, self._shared_lock)  # fmt: skip
        process, followers = start_team(context, start, config.learners, inbox, outbox)
        with spinning_threads():
            process.start()
            for follower in followers:
                follower.start()
        with self._cond:
            self._process, self._inbox, self._followers = process, inbox, followers
            self._capacity = capacity
            self._batch = config.queue_size
            self._waits_for_update = learner.waits_for_update and config.max_in_flight == 0
            if not restart:
                self._reserved = set()
            # A failed learner's queue is lost with it; a slot reserved meanwhile stays so.
            self._free = [slot for slot in range(capacity) if slot not in self._reserved]
            self.device, self._stopping, self._ready = str(device), False, False
            if restart:
                self.restarts += 1
            else:
                self.error, self.restarts, self.failures_in_a_row = None, 0, 0
                self.updates = self.used = self.dropped_stale = self.nonfinite_steps = 0
                self.metrics = {}
        self._reader = threading.Thread(
            target=self._read, args=(process, followers, outbox), name="a3c-learner-reader",
            daemon=True,
        )
        self._reader.start()
        log.info("learner started on %s (%s)", device, team_pids(process, followers))

    @property
    def _waiting(self) -> int:
        """Rollouts reserved or in the learner's queue, not yet used or dropped."""
        return self._capacity - len(self._free)

    def reserve(self, waiting: Callable[[], None] = lambda: None, wait: bool = True) -> int:
        """A slot for one rollout, waiting up to `hold_s` for one (LearnerBusy); `waiting` is
        called every second of the wait (the pushing worker is alive). Returns its number.
        `wait` False: WouldWait, nothing reserved, where the push would wait, for a slot or
        (a learner that `waits_for_update`) in `submit`."""
        deadline = time.monotonic() + self.hold_s
        while True:
            with self._cond:
                if not wait and self._process is not None and (
                    not self._free or self._waits_for_update
                ):
                    raise WouldWait
                if self._process is not None and not self._free:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise LearnerBusy(
                            f"the learner's queue is full ({self._capacity} rollouts wait for "
                            "it): retry shortly"
                        )
                    if self._cond.wait(min(left, 1.0)):
                        continue
                else:
                    if self._process is None:
                        raise LearnerBusy(self.error or "the learner is not running")
                    slot = self._free.pop()
                    self._reserved.add(slot)
                    return slot
            waiting()  # a second went by: outside the condition, which is a leaf lock

    def release(self, slot: int) -> None:
        """Give back a slot `reserve` took for a rollout that was not submitted."""
        with self._cond:
            if slot in self._reserved:  # else a new run's learner started meanwhile
                self._reserved.discard(slot)
                self._give_back([slot])

    def _give_back(self, slots: list[int]) -> None:
        """Free `slots` (held under `_cond`); one that is free already (the slots of a learner
        that failed were all freed when it started again) is left as it is."""
        free = set(self._free)
        self._free += [slot for slot in slots if slot not in free and slot < self._capacity]
        self._cond.notify_all()

    def submit(
        self,
        slot: int,
        tensors: Mapping[str, torch.Tensor],
        policy_version: int,
        env_steps: int,
        waiting: Callable[[], None] = lambda: None,
        partial_s: float = 0.0,
    ) -> None:
        """Queue a checked rollout (its decoded tensors, into the `slot` it reserved) for the
        learner: the tensors are copied into the slot in shared memory, and only its number
        crosses to the learner process. Dropped when the learner stopped meanwhile (its run
        ended). With a learner that `waits_for_update`, a rollout
        that completes a batch returns once that update is published (or the batch was broken
        up by drops, or after `hold_s`), and one that does not waits up to `partial_s` for the
        next update (0: it returns at once); `waiting` is called every second meanwhile."""
        with self._cond:
            slots = self._slots if slot in self._reserved else None
        if slots is None:  # a new run's learner started meanwhile
            return
        for name, tensor in tensors.items():  # reserved: no other push writes the slot
            slots[name][slot].copy_(tensor)
        with self._cond:
            if slot not in self._reserved:
                return
            self._reserved.discard(slot)
            if self._inbox is None or self._stopping:
                self._give_back([slot])
                return
            updates = self.updates
            completes = self._waits_for_update and self._waiting >= self._batch
            self._inbox.put(("rollout", slot, policy_version, env_steps))
        if not self._waits_for_update or not (completes or partial_s > 0):
            return
        deadline = time.monotonic() + (self.hold_s if completes else partial_s)
        while True:
            with self._cond:
                if not (
                    self._process is not None
                    and self.updates == updates
                    and (self._waiting >= self._batch or not completes)
                    and (left := deadline - time.monotonic()) > 0
                ):
                    return
                if self._cond.wait(min(left, 1.0)):
                    continue
            waiting()  # a second went by: outside the condition, which is a leaf lock

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """Stop the learner, taking its last weights and optimizer state first if it sends them
        within `wait_s`; one that has not begun to read its inbox ends at once."""
        with self.lifecycle:
            self._stop(wait_s)

    def _stop(self, wait_s: float) -> None:
        with self._cond:
            process, inbox, reader = self._process, self._inbox, self._reader
            followers = self._followers
            if process is None:
                return
            self._stopping = True
            ready = self._ready
        with contextlib.suppress(OSError, ValueError):  # a channel already closed
            inbox.put(("stop",))
        # A learner still starting (importing torch takes seconds) has taken no rollout and
        # holds nothing the master lacks: it is ended at once.
        end_team([process, *followers], wait_s if ready else 0)
        if reader is not None and reader is not threading.current_thread():
            reader.join(wait_s)
        with self._cond:
            self._process = self._inbox = self._reader = None
            self._followers = []
            self._cond.notify_all()

    def status(self) -> dict[str, Any]:
        with self._cond:
            return {
                "running": self._process is not None,
                "pid": self._process.pid if self._process is not None else None,
                # the team's others (`learners`), led by the first
                "follower_pids": [f.pid for f in self._followers],
                "device": self.device,
                "queued": self._waiting,
                "capacity": self._capacity,
                "updates": self.updates,
                "rollouts_used": self.used,
                "dropped_stale": self.dropped_stale,
                "nonfinite_steps": self.nonfinite_steps,
                "metrics": dict(self.metrics),
                "error": self.error,
                "restarts": self.restarts,
            }

    def _read(self, process: Any, followers: list[Any], outbox: Any) -> None:
        """The learner's messages, until it ends; a learner of its team that ends is its
        failure too (the team learns as one)."""
        while True:
            reported = False
            try:
                message = outbox.get(timeout=0.5)
                reported = True
            except queue.Empty:
                with self._cond:  # a stopping team's followers end first, as told
                    why = team_ended(process, [] if self._stopping else followers)
                if why is None:
                    continue
                message = ("error", why)
            except (EOFError, OSError):
                message = ("error", "the learner's channel closed")
            kind = message[0]
            if kind == "publication":
                self._take(message[1], process)
            elif kind == "ready":
                with self._cond:
                    self._ready = True
            elif kind == "stopped":
                return
            elif kind == "error":
                with self._cond:
                    stopping = self._stopping
                    if not stopping:
                        self.error = message[1]
                        self.failures_in_a_row += 1
                        self._process = self._inbox = None  # reserve() refuses from now on
                        self._followers = []
                    self._cond.notify_all()
                if not stopping:
                    log.error("learner failed: %s", message[1])
                    # one that reported is ending; one whose follower ended would wait for it
                    end_team([process, *followers], STOP_WAIT_S if reported else 0)
                    self._failed(message[1])
                return

    def _take(self, publication: Publication, process: Any) -> None:
        if publication.target is not None:  # numpy between the processes, as the weights
            publication.target = (torch.from_numpy(publication.target[0]), publication.target[1])
        if publication.changed:
            try:
                with holding(self._shared_lock, process.is_alive):  # no newer weights meanwhile
                    # The newest (the learner may be past this message's version), copied into
                    # the parameter server's network.
                    self._publish(int(self._shared_version.value), self._shared, publication)
            except PeerGone:  # killed while writing them, perhaps: nothing of it is taken, and
                return  # _read finds it ended and reports it (its restart gets a new lock)
        with self._cond:
            if publication.changed:
                self.updates += 1
                self.failures_in_a_row = 0
                # JSON has no NaN or infinity: a figure that is not finite is left out.
                self.metrics = {k: v for k, v in publication.metrics.items() if math.isfinite(v)}
            self.used += publication.used
            self.dropped_stale += publication.dropped
            self.nonfinite_steps += publication.nonfinite_steps
            self._give_back(publication.freed)
