"""Requests to the master with timeouts and bounded retries, and the errors a caller catches.

This is the half of the client that needs no torch (a3c_http/net/client.py is the other): the push
process (a3c_http/net/push_process.py) runs it in a child of the worker, which starts in a fifth of
a second because it imports httpx only. Each attempt is bounded by a3c_http/net/outbound.py: a total
deadline (the request's timeout), a size bound on the reply (A3C_MAX_BODY_BYTES) and the stop event,
which ends an attempt waiting for its reply within a fraction of a second.

The error hierarchy (everything a caller needs to catch is an `A3CError`)::

    A3CError
    ├── MasterUnavailable      the master could not be reached, timed out or answered 5xx,
    │                          on every attempt until the retry deadline ran out
    ├── ProtocolError          a reply that breaks the contract: weights that do not fit the
    │                          model (the WireError is its cause), a missing X-Model-Version,
    │                          a body larger than A3C_MAX_BODY_BYTES or a compressed one
    ├── Stopped                told to stop: while waiting for a reply or to retry, or before
    │                          the request was sent
    └── MasterRejected         the master answered 4xx: retrying the same request cannot help
        ├── Unauthorized       401/403: the token is missing or wrong
        └── Conflict           409: stale gradients, or a run that is not in the right state

Retries: connection errors, timeouts (an attempt past its deadline) and 5xx are retried with
exponential backoff and jitter until `retry_deadline_s` has passed since the first attempt; 4xx
are never retried, nor a reply too large (a lost contact and its end are logged once each,
a3c_http/server/logs.py `Outage`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from a3c_http.net.outbound import IDENTITY, STOPPABLE, BoundedTransport, Interrupted, ReplyRefused
from a3c_http.server.logs import Events, Outage
from a3c_http.wire.protocol import DEFAULT_MAX_BODY_BYTES, STOP_HEADER


class A3CError(Exception):
    """Base of every error raised by `MasterClient`."""


class MasterUnavailable(A3CError):
    """The master could not be reached, or kept failing (5xx), until the retry deadline."""


class ProtocolError(A3CError):
    """The master's reply does not follow the HTTP contract (see the cause)."""


class Stopped(A3CError):
    """The caller's stop event was set before a request was sent, or while it waited for its reply
    or to be retried: the worker was told to stop (its /stop, SIGTERM), so it waits for nothing."""


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


def detail_of(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


def check(response: httpx.Response) -> httpx.Response:
    """The response, if it is not an error; else the error it means."""
    if response.status_code < 400:
        return response
    stop = response.headers.get(STOP_HEADER) == "1"
    detail = detail_of(response)
    if response.status_code in (401, 403):
        raise Unauthorized(response.status_code, detail, stop)
    if response.status_code == 409:
        raise Conflict(response.status_code, detail, stop)
    raise MasterRejected(response.status_code, detail, stop)


class Transport:
    """Requests to the master at `base_url`, retried as the module says. Safe to use from
    several threads at once. `max_reply_bytes`: the largest reply body read (A3C_MAX_BODY_BYTES);
    `proxy_from_env`: go through the proxy the environment names for the master's URL
    (A3C_PROXY_FROM_ENV), else straight to it. Both apply to the default transport only (a
    `transport` given is used as it is)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout_s: float = 10.0,
        retry_deadline_s: float = 60.0,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        stop: threading.Event | None = None,
        events: Events | None = None,
        max_reply_bytes: int = DEFAULT_MAX_BODY_BYTES,
        proxy_from_env: bool = False,
    ) -> None:
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        headers = {**auth, **IDENTITY}
        self.base_url, self.token = base_url, token
        self.timeout_s = timeout_s
        self.max_reply_bytes, self.proxy_from_env = max_reply_bytes, proxy_from_env
        # Once set, a request ends (Stopped): its attempt, or its wait to retry, or before it is
        # sent (see `request`'s `stoppable`); never set, a retry's wait is a sleep.
        self.stop_event = stop or threading.Event()
        # HTTP_PROXY and the like are not for a cluster's own traffic unless A3C_PROXY_FROM_ENV
        # says so: the proxy, if any, is the transport's choice (trust_env=False below), so the
        # gradient pushes, which skip the client's machinery, take the same way.
        self._transport = transport or BoundedTransport(
            max_reply_bytes, self.stop_event, proxy_from_env, "A3C_MAX_BODY_BYTES"
        )
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout_s,
            transport=self._transport,
            trust_env=False,
        )
        self._headers = list(headers.items())  # the token, and no compression
        self.retry_deadline_s = retry_deadline_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.retries = 0  # attempts beyond the first, over the transport's life
        self.on_retry: Callable[[int], None] | None = None  # told the count at each retry
        self.outage = Outage(events or Events(logging.getLogger("a3c.client")), base_url)

    def options(self) -> dict[str, Any]:
        """What makes another Transport like this one (in the push process)."""
        return {
            "base_url": self.base_url,
            "token": self.token,
            "timeout_s": self.timeout_s,
            "retry_deadline_s": self.retry_deadline_s,
            "backoff_s": self.backoff_s,
            "max_backoff_s": self.max_backoff_s,
            "max_reply_bytes": self.max_reply_bytes,
            "proxy_from_env": self.proxy_from_env,
        }

    def close(self) -> None:
        self.http.close()

    def direct(
        self, method: str, path: str, content: bytes, headers: dict[str, str], timeout: float
    ) -> httpx.Response:
        """The request straight to the transport, without the client's cookies, redirects, URL
        merging and hooks: about a third of the CPU of a gradient push (docs/performance.md,
        "Capacity")."""
        base = self.http.base_url
        request = httpx.Request(
            method,
            base.copy_with(raw_path=base.raw_path.rstrip(b"/") + path.encode()),
            headers=[*self._headers, *headers.items()],
            content=content,
            extensions={"timeout": httpx.Timeout(timeout).as_dict()},
        )
        response = self._transport.handle_request(request)
        try:
            response.read()
        finally:
            response.close()
        return response

    def request(
        self,
        method: str,
        path: str,
        direct: dict[str, Any] | None = None,
        checked: bool = True,
        stoppable: bool = True,
        **kwargs: Any,
    ) -> httpx.Response:
        """`direct`: the arguments of `direct`, for the hot path; else those of httpx's.
        `checked`: raise the error a 4xx means (else return it, for the caller to judge).
        `stoppable`: once the stop event is set, an attempt ends (Stopped) or is not made; False:
        one attempt runs to its end regardless (a worker's last words), but is not retried."""
        if not stoppable:
            kwargs["extensions"] = {STOPPABLE: False}
        deadline = time.monotonic() + self.retry_deadline_s
        delay = self.backoff_s
        attempt = 0
        while True:
            attempt += 1
            try:
                if direct is not None:
                    response = self.direct(method, path, **direct)
                else:
                    response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            except ReplyRefused as exc:
                raise ProtocolError(f"the master's reply to {method} {path} {exc}") from None
            except Interrupted as exc:
                raise Stopped(f"{exc}: {method} {path}") from None
            else:
                if response.status_code < 500:
                    self.outage.answered()
                    return check(response) if checked else response
                problem = f"{response.status_code}: {detail_of(response)}"
            self.outage.failed(f"{method} {path}", problem, attempt)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MasterUnavailable(
                    f"the master at {self.http.base_url} is unreachable: {method} {path} failed "
                    f"{attempt} times over {self.retry_deadline_s:g} s, last: {problem}"
                )
            # The last wait ends at the deadline, for one more attempt there.
            if self.stop_event.wait(min(delay * random.uniform(0.5, 1.0), remaining)):
                raise Stopped(f"told to stop while waiting to retry {method} {path}: {problem}")
            delay = min(delay * 2, self.max_backoff_s)
            self.retries += 1
            if self.on_retry is not None:
                self.on_retry(self.retries)
