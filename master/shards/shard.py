"""One parameter-server shard's state: a slice of the global network's parameters and of its
optimizer's state (and of a dqn run's target network), the gradient slices staged for pushes, and
the versions applied in the master's order (master/shards/__init__.py says how a push crosses the
shards; master/shards/server.py serves this over HTTP)."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import threading
import time
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from a3c_http.algos.registry import config_json
from a3c_http.optim.flatnet import STEP_BOUND, WEIGHT_BOUND_LIMIT
from a3c_http.optim.optimizers import make_optimizer
from a3c_http.wire.tensors import Layout, WireError

# A staged slice whose push was never committed is dropped after this long.
STAGE_TTL_S = 120.0
# At most this many slices staged at once (a worker's pushes in flight, times the workers).
MAX_STAGED = 4096
# ... and at most this many bytes of them: 4,096 slices of a large model's would be gigabytes,
# held by pushes a worker staged and never committed.
MAX_STAGED_BYTES = 1 << 30
# How long `GET /shard/weights` waits for its version before it answers 503.
WEIGHTS_WAIT_S = 30.0
# The metadata entry of `/shard/open`'s and `/shard/state`'s bodies.
OPENING = "a3c_shard"


def receipt(key: bytes, epoch: str, index: int, worker: str, seq: int, sumsq: float) -> str:
    """What a shard signs when it stages a slice: the master admits a push only with every
    shard's receipt of its epoch (master/shards/coordinator.py)."""
    message = json.dumps([epoch, index, worker, seq, repr(float(sumsq))]).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class Refused(Exception):
    """A request the shard cannot take: `status` and a message that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class NotYet(Refused):
    """The version asked for is not applied yet (503 once the wait is over)."""


class Shard:
    """The slice and everything that changes with it (a dqn run's target network's slice too),
    under one condition."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.epoch: str | None = None  # None until the master opens the shard
        self.index = 0
        self.lo = self.hi = 0
        self.version = 0
        self._key = b""
        self._param: nn.Parameter | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._layout: Layout | None = None
        self._staged: dict[tuple[str, int], tuple[torch.Tensor, float]] = {}
        self._encoded: tuple[int, bytes] | None = None
        # A dqn run's target network: its slice, its version, refreshed every `_every` versions.
        self._target: torch.Tensor | None = None
        self.target_version: int | None = None
        self._every: int | None = None
        self._bound = 0.0  # at least the size of every weight (flatnet.py's `weight_bound`)
        self.applied = 0
        self.failed: str | None = None  # why the slice can no longer be trusted

    def open(self, body: bytes) -> dict[str, Any]:
        """A run's slice: its weights, its optimizer's state (entries `optimizer.NAME`, none
        for a fresh optimizer), and in the metadata the run's config, the slice's place, its
        version, the epoch and the receipts' key. Replaces whatever the shard held."""
        try:
            tensors = st_load(body)
            meta = json.loads(metadata_of(body)[OPENING])
            config = config_json(json.dumps(meta["config"]))
            weights = tensors["weights"].to(torch.float32).reshape(-1)
        except Exception as exc:  # noqa: BLE001 - any malformed opening is the same refusal
            raise Refused(422, f"not a shard's opening: {exc}") from None
        n = int(meta["hi"]) - int(meta["lo"])
        if weights.numel() != n:
            raise Refused(422, f"the slice has {weights.numel()} values, its place {n}")
        param = nn.Parameter(weights.clone())
        optimizer = make_optimizer([param], config)
        target = tensors.get("target")
        if target is not None and target.numel() != n:
            raise Refused(422, f"the target's slice has {target.numel()} values, its place {n}")
        state = {
            k.removeprefix("optimizer."): v
            for k, v in tensors.items()
            if k.startswith("optimizer.")
        }
        if state:
            groups = optimizer.state_dict()["param_groups"]
            optimizer.load_state_dict({"state": {0: state}, "param_groups": groups})
        with self.cond:
            self.epoch, self.index = str(meta["epoch"]), int(meta["index"])
            self.lo, self.hi, self.version = int(meta["lo"]), int(meta["hi"]), int(meta["version"])
            self._key = bytes.fromhex(meta["key"])
            self._param, self._optimizer = param, optimizer
            self._layout = Layout([("slice", (n,))], n, config.wire_dtype)
            self._staged = {}
            self._encoded = None
            self._bound = float(weights.abs().max()) if n else 0.0
            self._target = target.to(torch.float32).clone() if target is not None else None
            self.target_version = meta.get("target_version")
            self._every = meta.get("target_every")
            self.failed = None
            self.cond.notify_all()
        return self.status()

    def _check_epoch(self, epoch: str | None) -> Layout:
        if self.epoch is None or self._layout is None:
            raise Refused(409, "this shard holds no run yet: the master opens it with its run")
        if self.failed is not None:
            raise Refused(503, f"shard {self.index} failed ({self.failed}): the master resets it")
        if epoch is not None and epoch != self.epoch:
            raise Refused(
                409,
                f"epoch {epoch!r} is over (the shards were reset, now {self.epoch!r}): ask the "
                "master for its shards and pull the weights again",
            )
        return self._layout

    def stage(self, worker: str, seq: int, epoch: str, body: bytes) -> dict[str, Any]:
        """A worker's slice of a push's gradients, checked (finite, this slice's size) and kept
        until the master decides; answered with its sum of squares and a receipt."""
        with self.cond:
            layout = self._check_epoch(epoch)
            index, key = self.index, self._key
        try:
            vector, _ = layout.decode(body)
        except WireError as exc:
            raise Refused(422, f"shard {index}: {exc}; nothing staged") from None
        sumsq = float(torch.dot(vector, vector))
        if not math.isfinite(sumsq):
            raise Refused(
                422, f"shard {index}: the slice's norm overflows float32: gradients a worker "
                "clipped to max_grad_norm cannot; nothing staged",
            )  # fmt: skip
        now = time.monotonic()
        with self.cond:
            self._check_epoch(epoch)
            for old in [k for k, (_, at) in self._staged.items() if now - at > STAGE_TTL_S]:
                del self._staged[old]
            most = min(MAX_STAGED, max(1, MAX_STAGED_BYTES // (4 * max(1, vector.numel()))))
            if len(self._staged) >= most and (worker, seq) not in self._staged:
                raise Refused(
                    503, f"shard {index}: {most} pushes staged already and not committed (they "
                    f"are dropped {STAGE_TTL_S:g} s after their stage)",
                )  # fmt: skip
            self._staged[(worker, seq)] = (vector, now)
        return {
            "shard": index,
            "epoch": epoch,
            "sumsq": sumsq,
            "receipt": receipt(key, epoch, index, worker, seq, sumsq),
        }

    def apply(self, epoch: str, decisions: list[dict[str, Any]]) -> int:
        """The master's admitted pushes, each `{version, worker, seq, lr}`, in version order: each
        staged slice is stepped with its learning rate; one the shard has applied already is
        passed over (a resent batch). A gap or a slice not staged here fails the shard (the
        master then resets every shard)."""
        with self.cond:
            self._check_epoch(epoch)
            try:
                for decision in decisions:
                    version = int(decision["version"])
                    if version <= self.version:
                        continue
                    if version != self.version + 1:
                        raise Refused(409, f"version {version} after {self.version}: a gap")
                    staged = self._staged.pop((str(decision["worker"]), int(decision["seq"])), None)
                    if staged is None:
                        raise Refused(409, f"the push of version {version} was not staged here")
                    self._step(staged[0], float(decision["lr"]))
                    self.version = version
                    self.applied += 1
                    self._follow()
            except Refused as exc:
                self.failed = str(exc)
                raise
            finally:
                self.cond.notify_all()
            return self.version

    def _follow(self) -> None:
        """The target's slice becomes the weights' when `_every` versions have passed since it
        last did (master/learning/target.py `follow`'s rule, which the master keeps too)."""
        if self._target is None or self._every is None or self._param is None:
            return
        if self.version - (self.target_version or 0) >= self._every:
            self._target.copy_(self._param.detach())
            self.target_version = self.version

    def _step(self, gradient: torch.Tensor, lr: float) -> None:
        assert self._param is not None and self._optimizer is not None
        group = self._optimizer.param_groups[0]
        group["lr"] = lr
        self._param.grad = gradient
        try:
            getattr(self._optimizer, "apply", self._optimizer.step)()
        finally:
            self._param.grad = None
        self._bound += STEP_BOUND * lr
        if self._bound >= WEIGHT_BOUND_LIMIT:  # far from float32's limit, a step stays finite
            if not bool(torch.isfinite(self._param.detach()).all()):
                raise Refused(409, "a step left a weight non-finite")
            self._bound = float(self._param.detach().abs().max())

    def weights(self, version: int, wait_s: float = WEIGHTS_WAIT_S) -> tuple[bytes, int]:
        """The slice in the run's wire dtype once `version` is applied, and its version."""
        deadline = time.monotonic() + wait_s
        with self.cond:
            while True:
                layout = self._check_epoch(None)
                if self.version >= version:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NotYet(503, f"shard {self.index} has not applied version {version} yet")
                self.cond.wait(left)
            cached = self._encoded
            if cached is None or cached[0] != self.version:
                assert self._param is not None
                cached = self._encoded = (self.version, layout.encode(self._param.detach()))
            return cached[1], cached[0]

    def state(self) -> bytes:
        """The slice in float32 and its optimizer's per-element state, at one version."""
        with self.cond:
            self._check_epoch(None)
            assert self._param is not None and self._optimizer is not None
            tensors = {"weights": self._param.detach().clone()}
            for name, value in self._optimizer.state.get(self._param, {}).items():
                if torch.is_tensor(value):
                    tensors[f"optimizer.{name}"] = value.detach().clone()
            if self._target is not None:
                tensors["target"] = self._target.clone()
            meta = {
                "version": self.version, "epoch": self.epoch, "index": self.index,
                "target_version": self.target_version,
            }  # fmt: skip
        return st_save(tensors, {OPENING: json.dumps(meta)})

    def status(self) -> dict[str, Any]:
        with self.cond:
            return {
                "index": self.index,
                "epoch": self.epoch,
                "lo": self.lo,
                "hi": self.hi,
                "version": self.version,
                "applied": self.applied,
                "staged": len(self._staged),
                "failed": self.failed,
                "pid": os.getpid(),
            }


def metadata_of(body: bytes) -> dict[str, str]:
    """A safetensors body's `__metadata__` (safetensors' own reader drops it)."""
    size = int.from_bytes(body[:8], "little")
    return json.loads(body[8 : 8 + size]).get("__metadata__") or {}
