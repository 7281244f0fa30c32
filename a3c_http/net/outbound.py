"""The httpx transport of every call a service makes to another (a worker's to its master, the
master's `POST /start_worker` to its workers): each attempt bounded in time, size and by the
caller's stop, and proxies only when the settings ask for them.

httpx bounds each read of a socket (its timeout), not the whole reply: a peer that sends one byte
every 5 s holds a call with a 10 s timeout for as long as it likes, and one that streams gigabytes
fills the caller's memory. `BoundedTransport` makes each attempt:

- end at its deadline, the request's timeout counted from the attempt's start, however slowly the
  bytes come: `httpx.ReadTimeout` "no complete reply within 10 s", which callers retry as any
  timeout;
- fail with `ReplyRefused` as soon as the body passes `max_reply_bytes` (at once when its
  Content-Length says it will), read in httpcore's chunks, never whole; and so for a compressed
  body, whose decoded size that count would not bound (our services never compress);
- end with `Interrupted` within `SLICE_S` of the caller's stop event being set, while it waits
  for the reply or reads it; an attempt begun after it was set ends before anything is sent.
  A request whose `STOPPABLE` extension is False is exempt: a worker told to stop still sends
  its `POST /worker_done`, bounded by the deadline.

It does so in the network layer that httpcore's pools take: a socket's read waits in slices of
`SLICE_S` and looks at the attempt between two. The attempt is the calling thread's (httpcore's
sync pool does a request's I/O on the thread that sends it), so there is no thread per request, and
a gradient push pays a clock read and a thread-local lookup per read. httpx takes no network
backend, so a3c_http/tuning/ gives its pool ours; with A3C_TUNING=off (or an httpx whose
pool is not as it expects) the pool keeps httpx's own, and an attempt is bounded by httpx's
per-read timeout, the size bound and a stop set before it is sent, not by the deadline and the stop
while it waits.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

from a3c_http import tuning
from a3c_http.net import tls
from a3c_http.server.coalesce import HeldWrites

# How long a socket read waits before it looks at the deadline and the stop event again.
SLICE_S = 0.1
# Send with every request through a BoundedTransport: it refuses compressed replies.
IDENTITY = {"Accept-Encoding": "identity"}
# The request extension that, set to False, lets an attempt run to its end whatever the stop.
STOPPABLE = "a3c_stoppable"
_PROXY_SCHEMES = ("http", "https")


class ReplyRefused(Exception):
    """The reply passed the size bound, or came compressed: the attempt failed, retrying cannot
    help. The message completes "the reply ..."."""


class Interrupted(Exception):
    """The caller's stop event was set before the attempt, or while it waited for its reply or
    read it."""


class _Attempt:
    __slots__ = ("deadline", "stop", "timeout")

    def __init__(self, timeout: float | None, stop: threading.Event | None) -> None:
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.stop = stop

    def left(self) -> float | None:
        """Seconds to the deadline (None: no deadline); raises once the attempt is over."""
        if self.stop is not None and self.stop.is_set():
            raise Interrupted("told to stop while waiting for the reply")
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ReadTimeout(f"no complete reply within {self.timeout:g} s")
        return left


_attempts = threading.local()


def _current() -> _Attempt | None:
    return getattr(_attempts, "current", None)


def _capped(timeout: float | None, left: float | None) -> float | None:
    if left is None:
        return timeout
    return left if timeout is None else min(timeout, left)


class _SlicedStream(httpcore.NetworkStream):
    """httpcore's stream, whose reads wait in slices and whose writes end at the deadline."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream
        self._held = HeldWrites()

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        attempt = _current()
        self._send_held(timeout, attempt)
        if attempt is None:
            return self._stream.read(max_bytes, timeout)
        while True:
            left = attempt.left()
            try:
                return self._stream.read(max_bytes, SLICE_S if left is None else min(SLICE_S, left))
            except httpcore.ReadTimeout:
                pass  # a slice without a byte: look at the deadline and the stop again

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        # Held until the reply is read, so that a request's head and body leave in one send
        # (a3c_http/server/coalesce.py), unless too large to be joined.
        if self._held.hold(buffer):
            return
        attempt = _current()
        self._send_held(timeout, attempt)
        self._send(buffer, timeout, attempt)

    def _send_held(self, timeout: float | None, attempt: _Attempt | None) -> None:
        held = self._held.take()
        if held:
            self._send(held, timeout, attempt)

    def _send(self, buffer: bytes, timeout: float | None, attempt: _Attempt | None) -> None:
        # Not sliced (a timed-out send cannot say how much it sent): a request body goes out in
        # one send but for a peer that stops reading, which the deadline still ends.
        self._stream.write(buffer, timeout if attempt is None else _capped(timeout, attempt.left()))

    def close(self) -> None:
        self._held.take()  # a request whose reply is never read: nothing of it to send
        self._stream.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _SlicedStream(self._stream.start_tls(*args, **kwargs))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _SlicedBackend(httpcore.SyncBackend):
    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, **kwargs: Any
    ) -> httpcore.NetworkStream:
        attempt = _current()
        if attempt is not None:
            timeout = _capped(timeout, attempt.left())
        return _SlicedStream(super().connect_tcp(host, port, timeout, **kwargs))


class _BoundedBody(httpx.SyncByteStream):
    """A reply's body as httpcore reads it, counted against the bound as it comes."""

    def __init__(self, stream: httpx.SyncByteStream, limit: int, name: str) -> None:
        self._stream, self._limit, self._name = stream, limit, name

    def __iter__(self) -> Iterator[bytes]:
        size = 0
        for chunk in self._stream:
            size += len(chunk)
            if size > self._limit:
                raise ReplyRefused(f"passed {self._name} bytes")
            yield chunk

    def close(self) -> None:
        _attempts.current = None
        self._stream.close()


def _http_transport(proxy: str | None) -> httpx.HTTPTransport:
    # https:// peers verified against A3C_TLS_CA (or the system's CAs), this host's certificate
    # presented where a peer asks for one (a3c_http/net/tls.py)
    transport = httpx.HTTPTransport(proxy=proxy, verify=tls.current().client_context())
    # Every connection the pool opens later gets ours, where A3C_TUNING is on
    # (a3c_http/tuning/)
    tuning.install_network_backend(transport, _SlicedBackend())
    return transport


def environment_proxies() -> dict[str, str]:
    """The proxies the environment names (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY, either
    case), as Python's urllib reads them; a proxy without a scheme is http. Raises ValueError for
    a proxy other than http:// or https://."""
    found = urllib.request.getproxies_environment()
    proxies = {"no": found["no"]} if "no" in found else {}
    for scheme in ("http", "https", "all"):
        url = found.get(scheme)
        if not url:
            continue
        url = url if "://" in url else f"http://{url}"
        if urlsplit(url).scheme not in _PROXY_SCHEMES:
            raise ValueError(
                f"{scheme.upper()}_PROXY={url!r}: only http:// and https:// proxies are supported"
            )
        proxies[scheme] = url
    return proxies


class BoundedTransport(httpx.BaseTransport):
    """Requests over httpx's HTTP transport, each attempt bounded as the module says: by its
    timeout (the request's read timeout, which httpx.Client and `httpx.Timeout` set to the same
    value as the others), `max_reply_bytes` (`bound_name` names it in errors) and `stop`. With
    `proxy_from_env`, a request goes through the proxy the environment names for its URL (read
    once, here), else straight to its host."""

    def __init__(
        self,
        max_reply_bytes: int,
        stop: threading.Event | None = None,
        proxy_from_env: bool = False,
        bound_name: str | None = None,
    ) -> None:
        self.max_reply_bytes = max_reply_bytes
        self.stop = stop
        self._bound = f"{bound_name}={max_reply_bytes}" if bound_name else str(max_reply_bytes)
        self._proxies = environment_proxies() if proxy_from_env else {}
        self._direct = _http_transport(None)
        self._pools: dict[str, httpx.HTTPTransport] = {}  # by proxy URL
        self._routes: dict[tuple[str, str, int | None], httpx.HTTPTransport] = {}
        self._lock = threading.Lock()

    def proxy_for(self, url: httpx.URL) -> str | None:
        """The proxy a request to `url` goes through, if any."""
        if not self._proxies:
            return None
        host = f"[{url.host}]" if ":" in url.host else url.host
        address = f"{host}:{url.port}" if url.port else host
        if urllib.request.proxy_bypass_environment(address, self._proxies):
            return None
        return self._proxies.get(url.scheme) or self._proxies.get("all")

    def _transport_for(self, url: httpx.URL) -> httpx.HTTPTransport:
        if not self._proxies:
            return self._direct
        key = (url.scheme, url.host, url.port)
        transport = self._routes.get(key)
        if transport is None:
            proxy = self.proxy_for(url)
            with self._lock:
                if proxy is None:
                    transport = self._direct
                elif (transport := self._pools.get(proxy)) is None:
                    transport = self._pools[proxy] = _http_transport(proxy)
                self._routes[key] = transport
        return transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {}).get("read")
        stop = self.stop if request.extensions.get(STOPPABLE, True) else None
        if stop is not None and stop.is_set():
            raise Interrupted("told to stop before the request was sent")
        _attempts.current = _Attempt(timeout, stop)
        try:
            response = self._transport_for(request.url).handle_request(request)
            problem = self._refused(response.headers)
            if problem:
                response.close()
                raise ReplyRefused(problem)
        except BaseException:
            _attempts.current = None
            raise
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _BoundedBody(response.stream, self.max_reply_bytes, self._bound)
        return response

    def _refused(self, headers: httpx.Headers) -> str | None:
        declared = headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > self.max_reply_bytes:
            return f"announces {declared} bytes, which passes {self._bound} bytes"
        encoding = headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            return f"is compressed (Content-Encoding: {encoding}), which was not asked for"
        return None

    def close(self) -> None:
        for transport in {id(t): t for t in (self._direct, *self._pools.values())}.values():
            transport.close()
