"""What a request must show at the door of both services, before routing or reading its body:
the token (or, without one, a loopback client), and that no web page sent it.

A page the user visits can send requests to 127.0.0.1 too, so "loopback clients only" is not
enough without a token. Such a page is refused here on three grounds, none of which a page can
fake: its `Host` names another site (DNS rebinding: a name of the attacker's that resolves to
127.0.0.1), its browser says it comes from another site (`Sec-Fetch-Site`, `Origin`), or it is a
state-changing request a page can send without asking first (a CORS "simple" request: no body,
text/plain or a form), which only a page would send, since our clients send JSON or tensors.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
from urllib.parse import urlsplit

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from a3c_http.wire.protocol import CONTENT_TYPE as TENSOR_TYPE

JSON_TYPE = "application/json"
# The methods that change nothing, which a page may send without asking first.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The content types of CORS "simple" requests: a page sends them without a preflight.
SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
# Sec-Fetch-Site of a request from this service's own page, or typed by the user.
OWN_SITE = frozenset({"same-origin", "none"})
DEFAULT_PORTS = {"http": 80, "https": 443}
# The most (method, path) pairs `Gate` remembers as state-changing.
_MAX_STATE_CHANGING = 1024


@functools.lru_cache(maxsize=1024)  # asked for every request; parsing an address is not free
def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def authorize(
    token: str | None, authorization: str, client_host: str | None
) -> HTTPException | None:
    """docs/http-api.md's rule: with a token, `Authorization: Bearer <token>` (compared in
    constant time); without one, loopback clients only. Returns the error to answer with, or
    None."""
    if token:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), token.encode()
        ):
            return HTTPException(
                401,
                "missing or wrong token: send 'Authorization: Bearer <A3C_TOKEN>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return None
    if not is_loopback(client_host):
        return HTTPException(
            403,
            "A3C_TOKEN is not set, so only loopback clients are served: set the same "
            "A3C_TOKEN on the master and every worker, and send "
            "'Authorization: Bearer <token>'",
        )
    return None


def split_host(value: str) -> tuple[str, int | None]:
    """`Host` or an origin's authority as (lowercase host without brackets, port or None)."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:
        host, port = value, ""
    return host.removesuffix("."), int(port) if port.isdigit() else None


def names_this_service(host: str, server: str | None, allowed: frozenset[str]) -> bool:
    """Whether a tokenless service answers to `host` (from `split_host`): a loopback address,
    localhost or a name under .localhost (which browsers never resolve elsewhere), the address
    the connection arrived on, or a name of A3C_ALLOWED_HOSTS."""
    return (
        is_loopback(host)
        or host.endswith(".localhost")
        or (server is not None and host == server.lower())
        or host in allowed
    )


def _same_origin(origin: str, scheme: str, host_header: str) -> bool:
    """Whether `Origin` is the request's own: its scheme, and the host and port of `Host`."""
    try:
        parts = urlsplit(origin)
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return False
    host, own_port = split_host(host_header)
    return (
        parts.scheme == scheme
        and (parts.hostname or "").removesuffix(".") == host
        and port == (own_port or DEFAULT_PORTS.get(scheme))
    )


def _origin_host(origin: str) -> str:
    try:
        return (urlsplit(origin).hostname or "").removesuffix(".")
    except ValueError:
        return ""


def refuse_pages(
    scope: Scope,
    headers: dict[str, str],
    content_types: list[str],
    token: str | None,
    allowed: frozenset[str],
    tensor_paths: frozenset[str],
    changes_state: bool,
) -> HTTPException | None:
    """The error for a request a web page may have sent (see the module's docstring), or None.
    `content_types`: the media types of its Content-Type headers, lowercase, without parameters;
    `changes_state`: whether it is a method other than GET, HEAD or OPTIONS to a route that takes
    it (others are answered 404 or 405 and change nothing)."""
    host_header = headers.get("host")
    if not token and host_header is not None:
        # A request without Host (HTTP/1.0) cannot come from a page: browsers always send one.
        host, _ = split_host(host_header)
        server = scope.get("server")
        if not names_this_service(host, server[0] if server else None, allowed):
            return HTTPException(
                403,
                f"Host {host_header!r} does not name this service: without A3C_TOKEN it answers "
                "only to 127.0.0.1, localhost and its own address (a web page could reach it "
                "under a name of its own); use http://127.0.0.1:<port> or http://localhost:<port>, "
                "or add the name to A3C_ALLOWED_HOSTS",
            )
    site = headers.get("sec-fetch-site")
    if site is not None and site.strip().lower() not in OWN_SITE:
        return HTTPException(
            403,
            f"requests from another site's page are refused (Sec-Fetch-Site: {site}): open the "
            "dashboard at this service's own address, or send the request with curl or a script",
        )
    origin = headers.get("origin")
    if origin is not None and not (
        _same_origin(origin, scope.get("scheme", "http"), host_header or "")
        or _origin_host(origin) in allowed
    ):
        return HTTPException(
            403,
            f"requests from another site's page are refused (Origin: {origin}): open the "
            "dashboard at this service's own address, or add the origin's host name to "
            "A3C_ALLOWED_HOSTS",
        )
    if changes_state and (
        not content_types or any(t in SIMPLE_TYPES or not t for t in content_types)
    ):
        method = scope["method"]
        want = TENSOR_TYPE if scope["path"] in tensor_paths else JSON_TYPE
        sent = f"not {', '.join(content_types)!r}" if content_types else "and none was sent"
        return HTTPException(
            415,
            f"{method} {scope['path']} needs 'Content-Type: {want}' (a request a web page "
            f"cannot send without asking first), {sent}; with curl: -H 'Content-Type: {want}'",
        )
    return None


class Gate:
    """ASGI middleware: every request but `GET /healthz` and the `public` pages (the master's
    dashboard page and its scripts, which hold no data: the page asks for the token and sends it
    with each request it makes, and a link from another site must open it) passes `authorize`,
    then `refuse_pages`, before routing or reading the body.

    The token is judged first: a request without it learns nothing but 401 (or the 403 of a
    non-loopback client of a tokenless service), whatever else is wrong with it."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        public: frozenset[str],
        allowed_hosts: frozenset[str] = frozenset(),
        tensor_paths: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.token = token
        self.public = public | {"/healthz"}
        self.allowed_hosts = allowed_hosts
        self.tensor_paths = tensor_paths
        # (method, path) of requests found to change state: asked once each, not at every push
        # (FastAPI keeps included routers whole, so finding the route means matching them all).
        # Only what a route takes enters it, so it holds at most the routes' methods and paths.
        self._state_changing: set[tuple[str, str]] = set()

    def _changes_state(self, scope: Scope) -> bool:
        method = scope["method"]
        if method in SAFE_METHODS:
            return False
        key = (method, scope["path"])
        if key in self._state_changing:
            return True
        routes = getattr(getattr(scope.get("app"), "router", None), "routes", ())
        if any(route.matches(scope)[0] is Match.FULL for route in routes):
            if len(self._state_changing) < _MAX_STATE_CHANGING:  # paths with parameters
                self._state_changing.add(key)
            return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (
            scope["path"] in self.public and scope["method"] in ("GET", "HEAD")
        ):
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        content_types: list[str] = []
        for raw_name, raw_value in scope["headers"]:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = value
            if name == "content-type":
                content_types.append(value.partition(";")[0].strip().lower())
        client = scope.get("client")
        problem = authorize(
            self.token, headers.get("authorization", ""), client[0] if client else None
        ) or refuse_pages(
            scope,
            headers,
            content_types,
            self.token,
            self.allowed_hosts,
            self.tensor_paths,
            self._changes_state(scope),
        )
        if problem is None:
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"detail": problem.detail}, status_code=problem.status_code, headers=problem.headers
        )
        await response(scope, receive, send)
