"""`MasterClient`: typed calls to the master over httpx, with timeouts and bounded retries (the
requests and their errors: a3c_http/net/transport.py, whose names this module also exports).

Episode reports, pushes and weights carry `X-A3C-Seq`, a number that rises with each call and
stays the same on its retries, so a retry of a request whose reply was lost is not counted twice by
the master. Every push (gradients, experience) is built and sent by one sender, the client's base
`UpdateSender` (a3c_http/net/sender.py).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import torch

from a3c_http.net.push_process import PushProcess
from a3c_http.net.replies import _STOP, _VERSION, Weights, _run_summary
from a3c_http.net.sender import UpdateSender
from a3c_http.net.shards import ShardedPushes
from a3c_http.net.transport import (
    A3CError,
    Conflict,
    MasterRejected,
    MasterUnavailable,
    ProtocolError,
    Stopped,
    Transport,
    Unauthorized,
)
from a3c_http.server.logs import Events
from a3c_http.wire import tensors as wire
from a3c_http.wire.protocol import (
    CONTENT_TYPE,
    DEFAULT_MAX_BODY_BYTES,
    RUN_ID_HEADER,
    SEQ_HEADER,
    VERSION_HEADER,
)

__all__ = [
    "A3CError",
    "Conflict",
    "MasterClient",
    "MasterRejected",
    "MasterUnavailable",
    "ProtocolError",
    "Stopped",
    "Unauthorized",
    "Weights",
]




class MasterClient(UpdateSender):
    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout_s: float = 10.0,
        retry_deadline_s: float = 60.0,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        run_id: str | None = None,
        stop: threading.Event | None = None,
        events: Events | None = None,
        push_threads: int = 1,
        push_process: dict[str, Any] | None = None,
        max_reply_bytes: int = DEFAULT_MAX_BODY_BYTES,
        proxy_from_env: bool = False,
        push_url: str | None = None,
    ) -> None:
        """`push_gradients_async` sends up to `push_threads` pushes at once: from a child process
        when `push_process` is given (its log settings, log_level and log_format, and worker_id;
        started at the first push), else from threads of this process. `max_reply_bytes` and
        `proxy_from_env`: the worker's A3C_MAX_BODY_BYTES and A3C_PROXY_FROM_ENV (`Transport`),
        in this process and the push process alike. `push_url`: where gradient pushes go (the
        master's receivers, master/ingress/receivers.py); unset, `base_url` as every other call."""
        # Worker messages carry the run id so that a late message of an earlier run is refused.
        self.run_id = run_id
        events = events or Events(logging.getLogger("a3c.client"), run_id)
        self.transport = Transport(
            base_url, token, timeout_s, retry_deadline_s, backoff_s, max_backoff_s,
            transport, stop, events, max_reply_bytes, proxy_from_env,
        )
        self.pushes = self.transport if push_url is None else Transport(
            push_url, token, timeout_s, retry_deadline_s, backoff_s, max_backoff_s,
            transport, stop, events, max_reply_bytes, proxy_from_env,
        )
        self.push_threads = max(1, push_threads)
        self._push_options = push_process
        self._pusher: PushProcess | None = None
        self._senders: ThreadPoolExecutor | None = None
        self._seq = itertools.count(1)

    @property
    def retry_deadline_s(self) -> float:
        return self.transport.retry_deadline_s

    @retry_deadline_s.setter
    def retry_deadline_s(self, seconds: float) -> None:
        self.transport.retry_deadline_s = self.pushes.retry_deadline_s = seconds

    @property
    def retries(self) -> int:
        """Attempts beyond the first, over the client's life (its push process's included)."""
        pushes = self.pushes.retries if self.pushes is not self.transport else 0
        return self.transport.retries + pushes + (self._pusher.retries if self._pusher else 0)

    def _seq_header(self) -> dict[str, str]:
        return {SEQ_HEADER: str(next(self._seq))}

    def use_shards(self, layout: wire.Layout) -> None:
        """Push gradients to the run's parameter-server shards (a3c_http/net/shards.py), from
        sender threads, rather than to the master."""
        self.shard_pushes = ShardedPushes(self, layout)

    def close(self) -> None:
        """Close the connections; pushes not sent yet are dropped."""
        if self.shard_pushes is not None:
            self.shard_pushes.close()
        if self._pusher is not None:
            self._pusher.close()
        if self._senders is not None:
            self._senders.shutdown(wait=False, cancel_futures=True)
        self.transport.close()
        if self.pushes is not self.transport:
            self.pushes.close()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.transport.request(method, path, **kwargs)

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # -- run control ----------------------------------------------------------------------------

    def healthz(self) -> bool:
        return self._json("GET", "/healthz").get("status") == "ok"

    def status(self) -> dict[str, Any]:
        return self._json("GET", "/status")

    def train(self, **body: Any) -> dict[str, Any]:
        return self._json("POST", "/train", json=body)["data"]

    def stop(self) -> dict[str, Any]:
        return self._json("POST", "/stop", json={})

    # -- worker lifecycle -----------------------------------------------------------------------

    def join(
        self, name: str, url: str | None, run_id: str | None, worker_id: str | None
    ) -> dict[str, Any]:
        """POST /join: `{"run": ... or None, "retry_s"}` (master/api/run.py)."""
        body = {"name": name, "url": url, "run_id": run_id, "worker_id": worker_id}
        return self._json("POST", "/join", json=body)["data"]

    def worker_started(self, worker_id: str, url: str | None) -> dict[str, Any]:
        return self._json(
            "POST",
            "/worker_started",
            json={"worker_id": worker_id, "url": url, "run_id": self.run_id},
        )

    def worker_done(self, worker_id: str, error: str | None = None) -> dict[str, Any]:
        """Sent once the worker was told to stop too: its one attempt is not cut short."""
        return self._json(
            "POST",
            "/worker_done",
            json={"worker_id": worker_id, "error": error, "run_id": self.run_id},
            stoppable=False,
        )

    def heartbeat(self, worker_id: str, **stats: Any) -> bool:
        """Report liveness and progress; returns True when the master says to stop."""
        body = {"worker_id": worker_id, "run_id": self.run_id, **stats}
        return bool(self._json("POST", "/heartbeat", json=body)["data"]["stop"])

    def episode(self, worker_id: str, reward: float, length: int) -> dict[str, Any]:
        body = {"worker_id": worker_id, "reward": reward, "length": length, "run_id": self.run_id}
        return self._json("POST", "/episode", json=body, headers=self._seq_header())["data"]

    # -- tensors --------------------------------------------------------------------------------

    def _weights(
        self, headers: Mapping[str, str], content: bytes, layout: wire.Layout
    ) -> Weights:
        """The weights of a reply: its headers by lower-case name (`_run_summary`), its body."""
        try:
            version = int(headers[_VERSION])
            run_summary = _run_summary(headers)
        except (KeyError, ValueError):
            raise ProtocolError(
                f"the weights reply has no integer {VERSION_HEADER} header, or a malformed "
                "summary header"
            ) from None
        try:
            vector, _ = layout.decode(content)
        except wire.WireError as exc:
            raise ProtocolError(f"the master's weights do not fit this model: {exc}") from exc
        stop = headers.get(_STOP) == "1"
        return Weights(vector, layout, version, stop=stop, run_summary=run_summary)

    def _weights_reply(self, response: httpx.Response, layout: wire.Layout) -> Weights:
        return self._weights(response.headers, response.content, layout)

    def get_weights(
        self, layout: wire.Layout, if_not_version: int | None = None
    ) -> Weights | None:
        """The global weights, or None when they are still at `if_not_version`."""
        return self._versioned("/global_model_weights", layout, if_not_version)

    def get_target_weights(
        self, layout: wire.Layout, if_not_version: int | None = None
    ) -> Weights | None:
        """The run's target network (algo dqn), or None when it is still at `if_not_version`."""
        return self._versioned("/target_model_weights", layout, if_not_version)

    def _versioned(
        self, path: str, layout: wire.Layout, if_not_version: int | None
    ) -> Weights | None:
        headers = {"If-None-Match": f'"{if_not_version}"'} if if_not_version is not None else {}
        response = self._request("GET", path, headers=headers)
        if response.status_code == 304:
            return None
        return self._weights_reply(response, layout)

    def push_weights(
        self,
        worker_id: str,
        tensors: Mapping[str, torch.Tensor],
        temporary: bool,
        layout: wire.Layout | None = None,
    ) -> dict[str, Any]:
        """Send weights (best_weights mode): encoded by `layout`, in its wire dtype, or without
        one as float32 tensors one by one."""
        body = wire.encode(tensors) if layout is None else layout.encode(layout.flatten(tensors))
        return self._json(
            "POST",
            "/local_model_weights",
            params={"worker_id": worker_id, "temporary": str(temporary).lower()},
            content=body,
            headers={
                "Content-Type": CONTENT_TYPE,
                **self._seq_header(),
                **({RUN_ID_HEADER: self.run_id} if self.run_id else {}),
            },
        )

    def best_score(self) -> float | None:
        return self._json("GET", "/best_score")["data"]
