"""`MasterClient`: typed calls to the master over httpx, with timeouts and bounded retries.

The error hierarchy (everything a caller needs to catch is an `A3CError`)::

    A3CError
    ├── MasterUnavailable      the master could not be reached, timed out or answered 5xx,
    │                          on every attempt until the retry deadline ran out
    ├── ProtocolError          a reply that breaks the contract: weights that do not fit the
    │                          model (the WireError is its cause) or a missing X-Model-Version
    └── MasterRejected         the master answered 4xx: retrying the same request cannot help
        ├── Unauthorized       401/403: the token is missing or wrong
        └── Conflict           409: stale gradients, or a run that is not in the right state

Retries: connection errors, timeouts and 5xx are retried with exponential backoff and jitter until
`retry_deadline_s` has passed since the first attempt; 4xx are never retried (a lost contact and
its end are logged once each, a3c_http/logs.py `Outage`). Episode reports, gradients and weights
carry `X-A3C-Seq`, a number that rises with each call and stays the same on its retries, so a
retry of a request whose reply was lost is not counted twice by the master.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import torch

from a3c_http import wire
from a3c_http.logs import Events, Outage
from a3c_http.protocol import (
    BEST_SCORE_HEADER,
    CONTENT_TYPE,
    DUPLICATE_HEADER,
    GLOBAL_EPISODE_HEADER,
    GRAD_NORM_HEADER,
    IMPROVED_HEADER,
    LOSS_HEADER,
    MOVING_AVERAGE_HEADER,
    ROLLOUT_METADATA,
    RUN_ID_HEADER,
    SEQ_HEADER,
    STOP_HEADER,
    VERSION_HEADER,
    WORKER_ID_HEADER,
)


class A3CError(Exception):
    """Base of every error raised by `MasterClient`."""


class MasterUnavailable(A3CError):
    """The master could not be reached, or kept failing (5xx), until the retry deadline."""


class ProtocolError(A3CError):
    """The master's reply does not follow the HTTP contract (see the cause)."""


class Stopped(A3CError):
    """The caller's stop event was set while a request waited to be retried: the worker was told
    to stop (its /stop, SIGTERM), so it does not wait out the retry deadline."""


class MasterRejected(A3CError):
    """The master refused the request (4xx). `status_code` and `detail` say why."""

    def __init__(self, status_code: int, detail: str, stop: bool = False) -> None:
        super().__init__(f"master answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail
        self.stop = stop


class Unauthorized(MasterRejected):
    """401 or 403: set the same A3C_TOKEN on the master and the workers."""


class Conflict(MasterRejected):
    """409: stale gradients (pull the weights and go on) or a run in the wrong state."""


@dataclass(frozen=True)
class Weights:
    """Global weights: `vector` in `layout`'s order (`tensors`: its entries by name, as views).
    A gradient push's reply also carries the run's figures, as `POST /episode` answers them."""

    vector: torch.Tensor
    layout: wire.Layout
    version: int
    stop: bool = False
    figures: dict[str, Any] | None = None

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return self.layout.views(self.vector)


def _figures(response: httpx.Response) -> dict[str, Any] | None:
    headers = response.headers
    if GLOBAL_EPISODE_HEADER not in headers:
        return None
    best, average = headers.get(BEST_SCORE_HEADER), headers.get(MOVING_AVERAGE_HEADER)
    return {
        "global_episode": int(headers[GLOBAL_EPISODE_HEADER]),
        "best_score": float(best) if best is not None else None,
        "moving_average": float(average) if average is not None else None,
        "improved": headers.get(IMPROVED_HEADER) == "1",
        "stop": headers.get(STOP_HEADER) == "1",
        "duplicate": headers.get(DUPLICATE_HEADER) == "1",
    }


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


class MasterClient:
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
    ) -> None:
        # Worker messages carry the run id so that a late message of an earlier run is refused.
        self.run_id = run_id
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s
        # The workers talk to the master directly: HTTP_PROXY and the like are not for a
        # cluster's own traffic (and the gradient pushes below skip the client's machinery).
        self._transport = transport or httpx.HTTPTransport()
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout_s,
            transport=self._transport,
            trust_env=False,
        )
        self._auth = list(headers.items())
        self.retry_deadline_s = retry_deadline_s
        # Once set, a failed request is not retried (Stopped); never set, its wait is a sleep.
        self._stop_event = stop or threading.Event()
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._seq = itertools.count(1)
        self.retries = 0  # attempts beyond the first, over the client's life
        self.outage = Outage(events or Events(logging.getLogger("a3c.client"), run_id), base_url)

    def _seq_header(self) -> dict[str, str]:
        return {SEQ_HEADER: str(next(self._seq))}

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------------

    def _direct(
        self, method: str, path: str, content: bytes, headers: dict[str, str], timeout: float
    ) -> httpx.Response:
        """The request straight to the transport, without the client's cookies, redirects, URL
        merging and hooks: a third of the CPU of a gradient push, which a worker spends while it
        collects its next rollout (885 -> 586 us a push, measured on this machine)."""
        request = httpx.Request(
            method,
            self._http.base_url.copy_with(
                raw_path=self._http.base_url.raw_path.rstrip(b"/") + path.encode()
            ),
            headers=[*self._auth, *headers.items()],
            content=content,
            extensions={"timeout": httpx.Timeout(timeout).as_dict()},
        )
        response = self._transport.handle_request(request)
        try:
            response.read()
        finally:
            response.close()
        return response

    def _request(
        self, method: str, path: str, direct: dict[str, Any] | None = None, **kwargs: Any
    ) -> httpx.Response:
        """`direct`: the arguments of `_direct`, for the hot path; else those of httpx's."""
        deadline = time.monotonic() + self.retry_deadline_s
        delay = self.backoff_s
        attempt = 0
        while True:
            attempt += 1
            try:
                if direct is not None:
                    response = self._direct(method, path, **direct)
                else:
                    response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 500:
                    self.outage.answered()
                    return self._check(response)
                problem = f"{response.status_code}: {_detail(response)}"
            self.outage.failed(f"{method} {path}", problem, attempt)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MasterUnavailable(
                    f"the master at {self._http.base_url} is unreachable: {method} {path} failed "
                    f"{attempt} times over {self.retry_deadline_s:g} s, last: {problem}"
                )
            # The last wait ends at the deadline, for one more attempt there.
            if self._stop_event.wait(min(delay * random.uniform(0.5, 1.0), remaining)):
                raise Stopped(f"told to stop while waiting to retry {method} {path}: {problem}")
            delay = min(delay * 2, self.max_backoff_s)
            self.retries += 1

    @staticmethod
    def _check(response: httpx.Response) -> httpx.Response:
        if response.status_code < 400:
            return response
        stop = response.headers.get(STOP_HEADER) == "1"
        detail = _detail(response)
        if response.status_code in (401, 403):
            raise Unauthorized(response.status_code, detail, stop)
        if response.status_code == 409:
            raise Conflict(response.status_code, detail, stop)
        raise MasterRejected(response.status_code, detail, stop)

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
        return self._json("POST", "/stop")

    # -- worker lifecycle -----------------------------------------------------------------------

    def worker_started(self, worker_id: str, url: str | None) -> dict[str, Any]:
        return self._json(
            "POST",
            "/worker_started",
            json={"worker_id": worker_id, "url": url, "run_id": self.run_id},
        )

    def worker_done(self, worker_id: str, error: str | None = None) -> dict[str, Any]:
        return self._json(
            "POST",
            "/worker_done",
            json={"worker_id": worker_id, "error": error, "run_id": self.run_id},
        )

    def heartbeat(self, worker_id: str, **stats: Any) -> bool:
        """Report liveness and progress; returns True when the master says to stop."""
        body = {"worker_id": worker_id, "run_id": self.run_id, **stats}
        return bool(self._json("POST", "/heartbeat", json=body)["data"]["stop"])

    def episode(self, worker_id: str, reward: float, length: int) -> dict[str, Any]:
        body = {"worker_id": worker_id, "reward": reward, "length": length, "run_id": self.run_id}
        return self._json("POST", "/episode", json=body, headers=self._seq_header())["data"]

    # -- tensors --------------------------------------------------------------------------------

    def _weights(self, response: httpx.Response, layout: wire.Layout) -> Weights:
        try:
            version = int(response.headers[VERSION_HEADER])
            figures = _figures(response)
        except (KeyError, ValueError):
            raise ProtocolError(
                f"the weights reply has no integer {VERSION_HEADER} header, or a malformed "
                "figure header"
            ) from None
        try:
            vector, _ = layout.decode(response.content)
        except wire.WireError as exc:
            raise ProtocolError(f"the master's weights do not fit this model: {exc}") from exc
        return Weights(
            vector, layout, version, stop=response.headers.get(STOP_HEADER) == "1", figures=figures
        )

    def get_weights(
        self, layout: wire.Layout, if_not_version: int | None = None
    ) -> Weights | None:
        """The global weights, or None when they are still at `if_not_version`."""
        headers = {"If-None-Match": f'"{if_not_version}"'} if if_not_version is not None else {}
        response = self._request("GET", "/global_model_weights", headers=headers)
        if response.status_code == 304:
            return None
        return self._weights(response, layout)

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
        statistics, master/schemas.py RolloutReport) in the body's metadata. Returns the new
        global weights, with the run's figures. `wait_s`: how long the master may hold the
        reply beyond the usual timeout (a sync round's `sync_timeout_s`). Raises `Conflict` when
        they were too stale or an outlier. Safe to call from several threads at once."""
        vector = grads if isinstance(grads, torch.Tensor) else layout.flatten(grads)
        metadata = {ROLLOUT_METADATA: json.dumps(report)} if report is not None else None
        reported = {LOSS_HEADER: loss, GRAD_NORM_HEADER: grad_norm}
        headers = {
            "Content-Type": CONTENT_TYPE,
            WORKER_ID_HEADER: worker_id,
            VERSION_HEADER: str(version),
            **self._seq_header(),
            **({RUN_ID_HEADER: self.run_id} if self.run_id else {}),
            **{name: repr(float(v)) for name, v in reported.items() if v is not None},
        }
        content = layout.encode(vector, metadata)
        response = self._request(
            "POST",
            "/gradients",
            direct={"content": content, "headers": headers, "timeout": self.timeout_s + wait_s},
        )
        return self._weights(response, layout)

    def push_weights(
        self, worker_id: str, tensors: Mapping[str, torch.Tensor], temporary: bool
    ) -> dict[str, Any]:
        return self._json(
            "POST",
            "/local_model_weights",
            params={"worker_id": worker_id, "temporary": str(temporary).lower()},
            content=wire.encode(tensors),
            headers={
                "Content-Type": CONTENT_TYPE,
                **self._seq_header(),
                **({RUN_ID_HEADER: self.run_id} if self.run_id else {}),
            },
        )

    def best_score(self) -> float | None:
        return self._json("GET", "/best_score")["data"]
