"""The master's side of its parameter-server shards (master/shards/__init__.py): their processes,
the receipts a commit must bring, the admitted pushes handed to every shard in version order, the
gathering of every shard's slice at one version, and the reset after a shard fails.

`ShardSet` is owned by the parameter server (master/learning/parameter_server.py), which calls
`decide` under its own lock, so the order of the versions is the order of the decisions each
shard's sender thread delivers. Nothing here takes the parameter server's lock: the reset asks it
through the callback it was given.
"""

from __future__ import annotations

import collections
import hmac
import http.client
import json
import logging
import math
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from a3c_http.config.settings import Settings
from a3c_http.config.training import TrainConfig
from a3c_http.optim.flatnet import FlatNetwork
from a3c_http.wire.protocol import CONTENT_TYPE
from master.errors import Invalid, StateConflict, Unavailable
from master.learning.target import TargetNetwork
from master.shards.processes import ForkedShard, RemoteShard, ShardChannel, ended
from master.shards.server import CONTROL_HEADER
from master.shards.shard import OPENING, metadata_of, receipt

logger = logging.getLogger("a3c.master.shards")
# How long a starting shard may take to answer its health check.
START_WAIT_S = 60.0
# How long the master waits for every shard to apply what it decided (a save's gathering).
DRAIN_WAIT_S = 30.0
# At most this many decisions in one `POST /shard/apply`.
BATCH = 256
# How often a shard's process is looked at while no push comes.
WATCH_S = 0.5
# Starts of a failed shard before the run ends with the reason.
RESTARTS = 3
# How long the master waits for a shard started elsewhere (A3C_SHARDS_URLS) to answer again.
REMOTE_WAIT_S = 120.0


class ShardsDown(Unavailable):
    """The shards cannot take pushes now (503): one failed and the master is resetting them."""


def slices(n: int, shards: int) -> list[tuple[int, int]]:
    """`n` values cut in `shards` contiguous, nearly equal slices (the first ones the larger)."""
    size, extra = divmod(n, shards)
    bounds = [0]
    for i in range(shards):
        bounds.append(bounds[-1] + size + (1 if i < extra else 0))
    return list(zip(bounds, bounds[1:], strict=False))


class ShardSet:
    """A run's shards (their processes start with it): `open` them with the network, `verify` a
    commit's receipts, `decide` each admitted push, `gather` their slices. A shard that fails
    stops the pushes until `on_failure` (the facade's, master/shard_runs.py, called by the
    watcher thread) has started it again and opened every shard at one version."""

    def __init__(
        self,
        settings: Settings,
        config: TrainConfig,
        on_failure: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.count = config.shards
        self.config = config
        self.on_failure = on_failure  # the parameter server's: reset from its last gathering
        self.lock = threading.Condition()
        # The secret of the master's own calls, which workers never see (shard.py `create_app`):
        # its own for the shards it starts, A3C_SHARDS_SECRET for those started elsewhere.
        remote = settings.shards_urls
        if remote and len(remote) != self.count:
            raise RuntimeError(
                f"shards {self.count}, but A3C_SHARDS_URLS names {len(remote)}: name as many "
                "shards as the run's config asks for"
            )
        self._control = settings.shards_secret if remote else secrets.token_hex(16)
        self._procs: list[ForkedShard | RemoteShard] = (
            [RemoteShard(i, url) for i, url in enumerate(remote)]
            if remote
            else [self._process(i) for i in range(self.count)]
        )
        headers = {"Authorization": f"Bearer {settings.token}"} if settings.token else {}
        headers[CONTROL_HEADER] = self._control
        verify = settings.tls.client_context() if settings.tls.configured else True
        self._http = httpx.Client(headers=headers, timeout=30.0, verify=verify)
        self.epoch = ""
        self._key = b""
        self._slices: list[tuple[int, int]] = []
        self._queues: list[collections.deque] = [collections.deque() for _ in self._procs]
        self.decided = 0  # the last version decided
        self.delivered = [0] * self.count  # the last version each shard said it applied
        self.failure: str | None = None
        self._closed = False
        self._threads = [
            threading.Thread(target=self._deliver, args=(i,), daemon=True, name=f"a3c-shard-{i}")
            for i in range(self.count)
        ] + [threading.Thread(target=self._watch, daemon=True, name="a3c-shard-watch")]
        try:
            self._wait_healthy()
        except Exception:
            self.close()  # the shards that did start end here, not with the master
            raise

    def _process(self, index: int) -> ForkedShard:
        scheme = "https" if self.settings.tls.serves else "http"
        host, port = self.settings.shards_host, self.settings.shards_port
        return ForkedShard(index, host, port, scheme, self._control)

    # -- opening ----------------------------------------------------------------------------------

    def _wait_healthy(self, wait_s: float = START_WAIT_S) -> None:
        deadline = time.monotonic() + wait_s
        for proc in self._procs:
            while True:
                if isinstance(proc, ForkedShard) and not proc.alive():
                    code = ended(proc)
                    raise RuntimeError(f"shard {proc.index} ended at its start ({code})")
                try:
                    if self._http.get(f"{proc.url()}/healthz", timeout=2.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"shard {proc.index} ({proc.url()}) did not answer in {wait_s:g} s"
                    )
                time.sleep(0.05)  # polling a starting process's port

    def open(self, net: FlatNetwork, version: int, target: TargetNetwork | None = None) -> None:
        """Hand every shard its slice of `net`'s parameters and optimizer state at `version` (and
        of `target`'s weights, a dqn run's target network), under a new epoch and key (receipts
        of before are refused from now on)."""
        with self.lock:
            self.epoch = uuid.uuid4().hex[:16]
            self._key = secrets.token_bytes(32)
            self._slices = slices(net.layout.n_params, self.count)
            self.decided = version
            self.delivered = [version] * self.count
            for queue in self._queues:
                queue.clear()
            state = net.optimizer.state.get(net.params, {})
            for proc, (lo, hi) in zip(self._procs, self._slices, strict=True):
                tensors = {"weights": net.params.detach()[lo:hi].clone()}
                if target is not None and target.vector is not None:
                    tensors["target"] = target.vector[lo:hi].clone()
                for name, value in state.items():
                    if torch.is_tensor(value):
                        part = value[lo:hi] if value.dim() else value
                        tensors[f"optimizer.{name}"] = part.detach().clone()
                meta = {
                    "config": self.config.model_dump(mode="json"),
                    "index": proc.index, "lo": lo, "hi": hi, "version": version,
                    "epoch": self.epoch, "key": self._key.hex(),
                    "target_version": target.version if target is not None else None,
                    "target_every": target.every if target is not None else None,
                }  # fmt: skip
                body = st_save(tensors, {OPENING: json.dumps(meta)})
                reply = self._http.post(
                    f"{proc.url()}/shard/open", content=body, headers={"Content-Type": CONTENT_TYPE}
                )
                if reply.status_code != 200:
                    raise RuntimeError(f"shard {proc.index} refused its opening: {reply.text}")
            self.failure = None
            for proc in self._procs:
                if isinstance(proc, RemoteShard):
                    proc.healthy = True
            self.lock.notify_all()
        if not self._threads[0].is_alive():
            for thread in self._threads:
                thread.start()

    def plan(self, seen_as: str | None = None) -> dict[str, Any]:
        """What a worker needs to push to the shards: the epoch and each shard's URL (for a
        worker that reaches the master at `seen_as`) and slice."""
        with self.lock:
            return {
                "epoch": self.epoch,
                "down": self.failure,
                "shards": [
                    {"url": p.url(seen_as), "lo": lo, "hi": hi}
                    for p, (lo, hi) in zip(self._procs, self._slices, strict=True)
                ],
            }

    # -- a push ----------------------------------------------------------------------------------

    def verify(self, receipts: list[dict[str, Any]], worker: str, seq: int) -> float:
        """The push's gradient norm from every shard's receipt of this epoch; Invalid (422) for
        a receipt missing, repeated or not genuine, StateConflict (409) for another epoch's,
        ShardsDown (503) while the shards are being reset."""
        with self.lock:
            if self.failure is not None:
                raise ShardsDown(f"{self.failure}; the master is resetting the shards")
            epoch, key = self.epoch, self._key
        if sorted(int(r.get("shard", -1)) for r in receipts) != list(range(self.count)):
            raise Invalid(f"a commit needs one receipt of each of the {self.count} shards")
        total = 0.0
        for r in receipts:
            if r.get("epoch") != epoch:
                raise StateConflict(
                    f"shard {r['shard']}'s receipt is of epoch {r.get('epoch')!r}, the shards' is "
                    f"{epoch!r} (they were reset): nothing applied, pull the weights and go on"
                )
            sumsq = float(r.get("sumsq", math.nan))
            want = receipt(key, epoch, int(r["shard"]), worker, seq, sumsq)
            if not (math.isfinite(sumsq) and sumsq >= 0) or not hmac.compare_digest(
                want, str(r.get("receipt", ""))
            ):
                raise Invalid(f"shard {r['shard']}'s receipt is not the one it gave: not applied")
            total += sumsq
        return math.sqrt(total)

    def decide(self, version: int, worker: str, seq: int, lr: float) -> None:
        """An admitted push, `version` the next: every shard applies it, in this order."""
        with self.lock:
            self.decided = version
            decision = {"version": version, "worker": worker, "seq": seq, "lr": lr}
            for queue in self._queues:
                queue.append(decision)
            self.lock.notify_all()

    def _deliver(self, index: int) -> None:
        """Shard `index`'s sender: the decisions in order, a batch a request (`ShardChannel`)."""
        queue = self._queues[index]
        channel = ShardChannel(self.settings, self._http.headers)
        delivered_in = ""  # the epoch of the channel's connection
        while True:
            with self.lock:
                while not self._closed and (not queue or self.failure is not None):
                    self.lock.wait()
                if self._closed:
                    return
                batch = [queue[i] for i in range(min(BATCH, len(queue)))]
                epoch, url = self.epoch, self._procs[index].url()
            if epoch != delivered_in:  # a reset: the shard may be a new process at the same URL
                channel.close()
                delivered_in = epoch
            try:
                decided = {"epoch": epoch, "decisions": batch}
                status, text = channel.post(url, "/shard/apply", decided)
                problem = None if status == 200 else text
            except (OSError, http.client.HTTPException, ValueError) as exc:
                channel.close()
                problem = f"{type(exc).__name__}: {exc}"
            with self.lock:
                if epoch != self.epoch:
                    continue  # reset meanwhile: its queue starts afresh
                if problem is not None:
                    self._fail(f"shard {index} ({url}) failed to apply: {problem}")
                    continue
                for _ in batch:
                    queue.popleft()
                self.delivered[index] = int(json.loads(text)["version"])
                self.lock.notify_all()

    def _fail(self, why: str) -> None:
        """Stop the pushes (caller holds the lock); the watcher resets the shards."""
        if self.failure is None:
            self.failure = why
            logger.error("%s: pushes wait while the master resets the shards", why)
            self.lock.notify_all()

    def _watch(self) -> None:
        while True:
            self._look_at_remotes()
            with self.lock:
                self.lock.wait(WATCH_S)
                if self._closed:
                    return
                for proc in self._procs:
                    if not proc.alive():
                        self._fail(f"shard {proc.index} ended ({ended(proc)})")
                failure = self.failure
            if failure is not None:
                self.on_failure(failure)

    def _look_at_remotes(self) -> None:
        """A shard started elsewhere that does not answer, or answers with another epoch (it was
        started again, holding nothing), is down (outside the lock: these are calls)."""
        for proc in self._procs:
            if not isinstance(proc, RemoteShard) or self.failure is not None:
                continue
            epoch = self.epoch
            try:
                reply = self._http.get(f"{proc.url()}/shard/status", timeout=2.0)
                if epoch != self.epoch:  # opened again meanwhile: look next time
                    continue
                proc.healthy = reply.status_code == 200 and reply.json()["epoch"] == epoch
                proc.pid = reply.json().get("pid") if proc.healthy else proc.pid
            except (httpx.HTTPError, ValueError, KeyError):
                proc.healthy = False

    def restart_failed(self) -> None:
        """Start again every shard of the master's own whose process ended, and wait for those
        started elsewhere to answer again, up to REMOTE_WAIT_S (the reset's first half)."""
        remote = False
        for i, proc in enumerate(self._procs):
            if isinstance(proc, RemoteShard):
                remote = True
            elif not proc.alive():
                proc.stop()
                self._procs[i] = self._process(i)
        self._wait_healthy(REMOTE_WAIT_S if remote else START_WAIT_S)

    # -- gathering -------------------------------------------------------------------------------

    def gather(self, net: FlatNetwork, target: TargetNetwork | None = None) -> int:
        """Every shard's slice and optimizer state (and target slice, into `target`), once each
        has applied every decision, into `net`; the version they are at. The caller holds the
        tickets (no `decide` meanwhile)."""
        deadline = time.monotonic() + DRAIN_WAIT_S
        with self.lock:
            while min(self.delivered) < self.decided:
                if self.failure is not None:
                    raise ShardsDown(self.failure)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ShardsDown(f"the shards did not apply version {self.decided} in time")
                self.lock.wait(left)
            version = self.decided
        parts: dict[str, list[torch.Tensor]] = {}
        target_versions = set()
        for proc in self._procs:
            try:
                reply = self._http.get(f"{proc.url()}/shard/state")
            except httpx.HTTPError as exc:
                raise ShardsDown(f"shard {proc.index} gave no state: {exc}") from None
            if reply.status_code != 200:
                raise ShardsDown(f"shard {proc.index} gave no state: {reply.text}")
            for name, tensor in st_load(reply.content).items():
                parts.setdefault(name, []).append(tensor)
            target_versions.add(json.loads(metadata_of(reply.content)[OPENING])["target_version"])
        targets = parts.pop("target", None)
        if target is not None and targets is not None:
            (target_version,) = target_versions  # every shard refreshes at the same versions
            target.take(torch.cat(targets), target_version)
        with torch.no_grad():
            net.params.copy_(torch.cat(parts.pop("weights")))
        state = net.optimizer.state.setdefault(net.params, {})
        for name, tensors in parts.items():
            name = name.removeprefix("optimizer.")
            state[name] = torch.cat(tensors) if tensors[0].dim() else tensors[0].clone()
        net.weight_bound = float(net.params.detach().abs().max())
        return version

    def status(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                {
                    "index": p.index,
                    "url": p.url(),
                    "pid": p.pid if isinstance(p, RemoteShard) else p.proc.pid,
                    "alive": p.alive(),
                    "slice": list(s),
                    "version": self.delivered[p.index],
                }
                for p, s in zip(self._procs, self._slices, strict=True)
            ]

    def close(self) -> None:
        with self.lock:
            self._closed = True
            self.lock.notify_all()
        for proc in self._procs:
            proc.stop()
        self._http.close()
