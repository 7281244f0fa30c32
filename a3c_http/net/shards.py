"""A worker's gradient pushes in a run with parameter-server shards (config `shards`,
master/shards/__init__.py): each push staged on every shard, committed to the master, and the new
weights fetched from every shard, the shards' calls in parallel.

The shards' addresses and slices come from the master (`GET /shards`). A shard that cannot be
reached, or a commit refused because the shards were reset, drops the push as a stale one is
dropped (`Conflict`): the worker asks the master for its shards again, waiting while it resets
them, and the next reply or the master's weights bring it up to date.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from a3c_http.net.replies import Weights
from a3c_http.net.transport import (
    Conflict,
    MasterUnavailable,
    ProtocolError,
    Stopped,
    Transport,
)
from a3c_http.wire import tensors as wire
from a3c_http.wire.protocol import (
    CONTENT_TYPE,
    SEQ_HEADER,
    SHARD_EPOCH_HEADER,
    SHARD_STAGE_PATH,
    SHARD_WEIGHTS_PATH,
    SHARDS_PATH,
    VERSION_HEADER,
    WORKER_ID_HEADER,
)

if TYPE_CHECKING:
    from a3c_http.net.client import MasterClient

# A shard that does not answer for this long is taken to be down (the master resets the shards):
# the push is dropped rather than retried against an address that may be gone.
SHARD_RETRY_S = 3.0
# How often the worker asks the master whether its shards are back.
DOWN_POLL_S = 0.5
# The run's summary in a commit's reply (a3c_http/net/replies.py `_run_summary`'s fields).
_SUMMARY = ("global_episode", "best_score", "moving_average", "improved", "stop", "duplicate")


class _Shard:
    def __init__(self, client: MasterClient, url: str, lo: int, hi: int, dtype: str) -> None:
        base = client.transport
        self.transport = Transport(
            url, base.token, base.timeout_s, SHARD_RETRY_S, base.backoff_s, base.max_backoff_s,
            stop=base.stop_event, max_reply_bytes=base.max_reply_bytes,
            proxy_from_env=base.proxy_from_env,
        )  # fmt: skip
        self.url, self.lo, self.hi = url, lo, hi
        self.layout = wire.Layout([("slice", (hi - lo,))], hi - lo, dtype)


class ShardedPushes:
    """The pushes of one worker's client (`MasterClient.use_shards`); safe from several threads."""

    def __init__(self, client: MasterClient, layout: wire.Layout) -> None:
        self.client = client
        self.layout = layout
        self._lock = threading.Lock()
        self._epoch: str | None = None
        self._shards: list[_Shard] = []
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._retired: list[_Shard] = []

    def _plan(self) -> tuple[str, list[_Shard]]:
        with self._lock:
            if self._epoch is None:
                self._refresh()
            assert self._epoch is not None
            return self._epoch, self._shards

    def _refresh(self) -> None:
        """The master's shards, once they are up (caller holds the lock)."""
        deadline = time.monotonic() + self.client.retry_deadline_s
        while True:
            plan = self.client._json("GET", SHARDS_PATH)
            if not plan.get("down"):
                break
            if time.monotonic() > deadline:
                raise MasterUnavailable(f"the master's shards stayed down: {plan['down']}")
            self.client.transport.stop_event.wait(DOWN_POLL_S)
        # Pushes of the old plan may still be on their way: its connections close with the client.
        self._retired.extend(self._shards)
        self._shards = [
            _Shard(self.client, s["url"], int(s["lo"]), int(s["hi"]), self.layout.dtype)
            for s in plan["shards"]
        ]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(len(self._shards), thread_name_prefix="a3c-shard")
        self._epoch = str(plan["epoch"])

    def _forget(self, epoch: str) -> None:
        with self._lock:
            if self._epoch == epoch:
                self._epoch = None

    def push(self, *args: Any) -> Weights:
        """`_push`; a push cut short by `close` (the worker's end) is `Stopped`."""
        try:
            return self._push(*args)
        except (RuntimeError, OSError) as exc:
            if not self._closed:
                raise
            raise Stopped(f"the worker closed its client: {exc}") from None

    def _push(
        self,
        worker_id: str,
        version: int,
        vector: torch.Tensor,
        seq: int,
        loss: float | None,
        grad_norm: float | None,
        report: Mapping[str, Any] | None,
    ) -> Weights:
        """Stage, commit, fetch (the module's docstring); Conflict when the push was refused
        (stale, an outlier, the shards reset)."""
        epoch, shards = self._plan()
        assert self._pool is not None
        try:
            receipts = list(
                self._pool.map(lambda s: self._stage(s, worker_id, seq, epoch, vector), shards)
            )
        except (MasterUnavailable, Conflict, ProtocolError) as exc:
            self._forget(epoch)
            raise Conflict(409, f"the shards could not stage this push ({exc}): dropped") from None
        body = {
            "worker_id": worker_id, "run_id": self.client.run_id, "version": version, "seq": seq,
            "loss": loss, "grad_norm": grad_norm, "receipts": receipts,
            "report": json.dumps(report) if report is not None else None,
        }  # fmt: skip
        try:
            reply = self.client._json("POST", f"{SHARDS_PATH}/commit", json=body)
        except Conflict:
            self._forget(epoch)  # another epoch's receipts, or simply stale: asked afresh
            raise
        at = int(reply["version"])
        try:
            parts = list(self._pool.map(lambda s: self._fetch(s, at), shards))
        except (MasterUnavailable, Conflict, ProtocolError) as exc:
            self._forget(epoch)
            raise Conflict(409, f"the shards' weights could not be fetched ({exc})") from None
        summary = {k: reply[k] for k in _SUMMARY if k in reply}
        return Weights(
            torch.cat([v for v, _ in parts]),
            self.layout,
            min(v for _, v in parts),
            stop=bool(reply.get("stop")),
            run_summary=summary,
        )

    def _stage(
        self, shard: _Shard, worker_id: str, seq: int, epoch: str, vector: torch.Tensor
    ) -> dict[str, Any]:
        headers = {
            "Content-Type": CONTENT_TYPE, WORKER_ID_HEADER: worker_id, SEQ_HEADER: str(seq),
            SHARD_EPOCH_HEADER: epoch,
        }  # fmt: skip
        content = shard.layout.encode(vector[shard.lo : shard.hi])
        return shard.transport.request(
            "POST", SHARD_STAGE_PATH, content=content, headers=headers
        ).json()

    def _fetch(self, shard: _Shard, version: int) -> tuple[torch.Tensor, int]:
        reply = shard.transport.request("GET", SHARD_WEIGHTS_PATH, params={"version": version})
        try:
            vector, _ = shard.layout.decode(reply.content)
            return vector, int(reply.headers[VERSION_HEADER])
        except (wire.WireError, KeyError, ValueError) as exc:
            raise ProtocolError(f"shard {shard.url}'s weights do not fit its slice: {exc}") from exc

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for shard in self._shards + self._retired:
            shard.transport.close()
