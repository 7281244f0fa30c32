"""Every push a worker makes (gradients, experience), built by one function and sent by one
sender to where pushes go (the receivers' `push_url`, else the master's one update route,
master/ingress/updates.py): `UpdateSender`, a base of `MasterClient` (a3c_http/net/client.py), whose
connections, request numbers and reply reading it uses. With a push process
(a3c_http/net/push_process.py) the `_async` calls hand a push over and return at once; without one
a sender thread sends it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from a3c_http.net.push_process import PushProcess
from a3c_http.net.replies import _STOP, _VERSION, Weights, _run_summary
from a3c_http.net.shards import ShardedPushes
from a3c_http.net.transport import ProtocolError
from a3c_http.wire import tensors as wire
from a3c_http.wire.named_tensors import encode_tensors
from a3c_http.wire.protocol import (
    CONTENT_TYPE,
    EXPERIENCE_HOLD_S,
    GRAD_NORM_HEADER,
    LOSS_HEADER,
    ROLLOUT_METADATA,
    RUN_ID_HEADER,
    SEQ_HEADER,
    VERSION_HEADER,
    WORKER_ID_HEADER,
)


def _metadata(report: Mapping[str, Any] | None) -> dict[str, str] | None:
    """A push body's metadata: the rollout's report (master/api/schemas.py RolloutReport)."""
    return {ROLLOUT_METADATA: json.dumps(report)} if report is not None else None


class UpdateSender:
    """The pushes of `MasterClient`, which sets what they use: `pushes` (the transport to where
    pushes go), `transport`, `run_id`, `push_threads`, `_push_options` (None: sender threads),
    `_pusher`, `_senders`, `_seq_header` and `_weights`; `shard_pushes` once the run's gradients
    go to parameter-server shards (`MasterClient.use_shards`)."""

    shard_pushes: ShardedPushes | None = None

    def push_gradients(
        self,
        worker_id: str,
        version: int,
        grads: Mapping[str, torch.Tensor] | torch.Tensor,
        layout: wire.Layout,
        loss: float | None = None,
        grad_norm: float | None = None,
        wait_s: float = 0.0,
        report: Mapping[str, Any] | None = None,
    ) -> Weights:
        """Send gradients computed on weights `version` (by name, or as one vector in the
        layout's order), with the rollout's loss and their norm before clipping (for the
        master's outlier check), and the rollout `report` (finished episodes and the worker's
        statistics, master/api/schemas.py RolloutReport) in the body's metadata. Returns the new
        global weights, with the run's summary. `wait_s`: how long the master may hold the
        reply beyond the usual timeout (a sync round's `sync_timeout_s`). Raises `Conflict` when
        they were too stale or an outlier. Safe to call from several threads at once."""
        if self.shard_pushes is not None:
            return self._sharded(worker_id, version, grads, layout, loss, grad_norm, wait_s, report)
        return self._send(
            self._gradients(worker_id, version, grads, layout, loss, grad_norm, wait_s, report),
            layout,
        )

    def push_gradients_async(
        self,
        worker_id: str,
        version: int,
        grads: Mapping[str, torch.Tensor] | torch.Tensor,
        layout: wire.Layout,
        **extra: Any,
    ) -> Future:
        """`push_gradients` (the same arguments), from the sender (`_send_async`): returns at
        once, with a future of its result."""
        if self.shard_pushes is not None:
            sharded = self._sharded
            return self._in_thread(lambda: sharded(worker_id, version, grads, layout, **extra))
        return self._send_async(
            lambda: self._gradients(worker_id, version, grads, layout, **extra), layout
        )

    def _sharded(
        self,
        worker_id: str,
        version: int,
        grads: Mapping[str, torch.Tensor] | torch.Tensor,
        layout: wire.Layout,
        loss: float | None = None,
        grad_norm: float | None = None,
        wait_s: float = 0.0,
        report: Mapping[str, Any] | None = None,
    ) -> Weights:
        """A gradient push to the run's shards (a3c_http/net/shards.py)."""
        assert self.shard_pushes is not None
        vector = grads if isinstance(grads, torch.Tensor) else layout.flatten(grads)
        seq = int(self._seq_header()[SEQ_HEADER])
        return self.shard_pushes.push(worker_id, version, vector, seq, loss, grad_norm, report)

    def push_experience(
        self,
        worker_id: str,
        version: int,
        tensors: Mapping[str, torch.Tensor],
        layout: wire.Layout,
        report: Mapping[str, Any] | None = None,
    ) -> Weights:
        """Send a rollout (`tensors`: a3c_http/algos/learner.py `rollout_tensors`) acted by
        the weights of `version`, with its `report` in the body's metadata, to the learner
        beside the master (`POST /experience`). Returns the newest weights when the master's
        are newer than `version`, else `Weights` without a vector (the master's version and the
        run's summary alone). Safe to call from several threads at once."""
        return self._send(self._experience(worker_id, version, tensors, report), layout)

    def push_experience_async(
        self,
        worker_id: str,
        version: int,
        tensors: Mapping[str, torch.Tensor],
        layout: wire.Layout,
        report: Mapping[str, Any] | None = None,
    ) -> Future:
        """`push_experience` (the same arguments), from the sender (`_send_async`): returns at
        once, with a future of its result."""
        return self._send_async(
            lambda: self._experience(worker_id, version, tensors, report), layout
        )

    def _gradients(
        self,
        worker_id: str,
        version: int,
        grads: Mapping[str, torch.Tensor] | torch.Tensor,
        layout: wire.Layout,
        loss: float | None = None,
        grad_norm: float | None = None,
        wait_s: float = 0.0,
        report: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A gradient push (see `push_gradients`) as `_update`'s request."""
        vector = grads if isinstance(grads, torch.Tensor) else layout.flatten(grads)
        reported = {LOSS_HEADER: loss, GRAD_NORM_HEADER: grad_norm}
        return self._update(
            "/gradients",
            worker_id,
            version,
            layout.encode(vector, _metadata(report)),
            {name: repr(float(v)) for name, v in reported.items() if v is not None},
            self.transport.timeout_s + wait_s,
        )

    def _experience(
        self,
        worker_id: str,
        version: int,
        tensors: Mapping[str, torch.Tensor],
        report: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """An experience push (see `push_experience`) as `_update`'s request; a full learner's
        queue may hold it for EXPERIENCE_HOLD_S."""
        return self._update(
            "/experience",
            worker_id,
            version,
            encode_tensors(tensors, _metadata(report)),
            {},
            self.transport.timeout_s + EXPERIENCE_HOLD_S,
        )

    def _update(
        self,
        path: str,
        worker_id: str,
        version: int,
        content: bytes,
        headers: dict[str, str],
        timeout: float,
    ) -> dict[str, Any]:
        """A push to `path` as the sender takes it: `Transport.direct`'s arguments and the path,
        with the headers every push carries (master/api/schemas.py `PushHeaders`)."""
        return {
            "path": path,
            "content": content,
            "headers": {
                "Content-Type": CONTENT_TYPE,
                WORKER_ID_HEADER: worker_id,
                VERSION_HEADER: str(version),
                **self._seq_header(),
                **({RUN_ID_HEADER: self.run_id} if self.run_id else {}),
                **headers,
            },
            "timeout": timeout,
        }

    def _send(self, update: dict[str, Any], layout: wire.Layout) -> Weights:
        """Send one push (`_update`'s) to where pushes go (`push_url`) and read its reply."""
        path = update.pop("path")
        return self._reply(self.pushes.request("POST", path, direct=update), layout)

    def _send_async(self, build: Callable[[], dict[str, Any]], layout: wire.Layout) -> Future:
        """Send the push `build` makes from the push process or a sender thread (see the
        constructor): returns at once, with a future of `_reply`'s result. A sender thread
        builds it too (the encoding leaves the caller's thread); the push process takes it
        built."""
        if self._push_options is None:
            return self._in_thread(lambda: self._send(build(), layout))
        if self._pusher is None:
            options = {**self._push_options, **self.pushes.options(), "run_id": self.run_id}
            self._pusher = PushProcess(options, self.push_threads, self.transport.stop_event)
        update = build()
        return self._pusher.submit(
            "POST", update.pop("path"), **update, convert=lambda reply: self._reply(reply, layout)
        )

    def _in_thread(self, call: Callable[[], Weights]) -> Future:
        """`call` in one of the sender threads."""
        if self._senders is None:
            self._senders = ThreadPoolExecutor(self.push_threads, thread_name_prefix="a3c-push")
        return self._senders.submit(call)

    def _reply(self, reply: Any, layout: wire.Layout) -> Weights:
        """What a push's reply (an httpx.Response, or the push process's `Reply`) brings: the
        weights (200), or the master's version and the run's summary alone (204: an experience
        push from a worker whose weights are the newest)."""
        if reply.status_code != 204:
            return self._weights(reply.headers, reply.content, layout)
        try:
            version = int(reply.headers[_VERSION])
            summary = _run_summary(reply.headers)
        except (KeyError, ValueError):
            raise ProtocolError(f"the reply has no integer {VERSION_HEADER} header") from None
        stop = reply.headers.get(_STOP) == "1"
        return Weights(None, layout, version, stop=stop, run_summary=summary)

