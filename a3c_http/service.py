"""What the master and the workers share as HTTP services: the auth middleware, the body-size
limit, readable validation errors, the errors their OpenAPI schemas declare and the health route.
The services import this module, never each other.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request, Security
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from a3c_http import apidocs


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def authorize(
    token: str | None, authorization: str, client_host: str | None
) -> HTTPException | None:
    """API.md's rule: with a token, `Authorization: Bearer <token>` (compared in constant time);
    without one, loopback clients only. Returns the error to answer with, or None."""
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


class Auth:
    """ASGI middleware enforcing `authorize` on every path and method but `GET /healthz` and the
    `public` paths (the master's dashboard page and its scripts, which hold no data: the page
    asks for the token and sends it with each request it makes), before routing or reading the
    body: an unauthorised request learns nothing but 401/403."""

    def __init__(self, app: ASGIApp, token: str | None, public: frozenset[str]) -> None:
        self.app = app
        self.token = token
        self.public = public | {"/healthz"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (
            scope["path"] in self.public and scope["method"] in ("GET", "HEAD")
        ):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        client = scope.get("client")
        problem = authorize(
            self.token, headers.get("authorization", ""), client[0] if client else None
        )
        if problem is None:
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"detail": problem.detail}, status_code=problem.status_code, headers=problem.headers
        )
        await response(scope, receive, send)


health_router = APIRouter()


@health_router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@health_router.head("/healthz", include_in_schema=False)
def healthz_head() -> dict[str, str]:
    return {"status": "ok"}  # uvicorn sends the headers only


class BodyLimit:
    """ASGI middleware: 413 for bodies over `max_bytes`, before they are read whole, whether they
    announce a Content-Length or arrive chunked. A chunked body is cut off as soon as it passes the
    limit: the 413 is sent at once, and whatever the app does with the cut body (FastAPI would
    answer 400 to a JSON body it could not read) is dropped."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
            return
        seen = 0
        started = rejected = False

        async def limited_receive() -> Message:
            nonlocal seen, rejected
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    if not started and not rejected:
                        rejected = True
                        await self._reject(send)
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if rejected:
                return  # the 413 went out already
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not rejected:
                raise

    async def _reject(self, send: Send) -> None:
        response = JSONResponse(
            {"detail": f"request body larger than {self.max_bytes} bytes (A3C_MAX_BODY_BYTES)"},
            status_code=413,
        )
        await response({"type": "http"}, _no_receive, send)


class _TooLarge(Exception):
    pass


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def describe_error(error: dict) -> str:
    """One pydantic error as `where: what`, as every 422 of both services names it."""
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "header")]
    where = ".".join(loc) or "body"
    return f"{where}: {error.get('msg', 'invalid')}"


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    message = "; ".join(describe_error(e) for e in errors) or "invalid request"
    safe = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in errors
    ]
    return JSONResponse({"detail": message, "errors": safe}, status_code=422)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """FastAPI's answer, but a 405's `Allow` lists every method the path takes: Starlette lists
    only those of the first route it tried (`GET` for /best_score, which also takes POST)."""
    if exc.status_code == 405:
        allowed = [
            method
            for method in _METHODS
            if any(
                route.matches({**request.scope, "method": method})[0] is Match.FULL
                for route in request.app.router.routes
            )
        ]
        if allowed:
            headers = {**(exc.headers or {}), "Allow": ", ".join(allowed)}
            exc = StarletteHTTPException(405, exc.detail, headers=headers)
    return await http_exception_handler(request, exc)


class FieldError(BaseModel):
    """One problem of a request that does not fit the schema: where, what, of which kind."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """The JSON body of every error: `detail` says what was wrong. The 422 of a request that does
    not fit the schema also lists each problem in `errors`."""

    detail: str
    errors: list[FieldError] | None = None


def error(description: str, **extra: Any) -> dict[str, Any]:
    """An error response as routes declare it (`responses=`): its body is an `ErrorBody`."""
    return {"model": ErrorBody, "description": description, **extra}


# Declared where they happen: AUTH_ERRORS on every router but /healthz's (`Auth`); INVALID on
# routes with parameters or a body (our 422 body instead of FastAPI's); BINARY_BODY on those that
# take a body (`BodyLimit`); JSON_BODY on those that take JSON (FastAPI's 400 for a body it cannot
# parse); `conflict(when)` on those that answer 409.
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: error(
        "missing or wrong token: send `Authorization: Bearer <A3C_TOKEN>`",
        headers={"WWW-Authenticate": {"schema": {"type": "string"}}},
    ),
    403: error("A3C_TOKEN is not set and the client is not loopback"),
}
INVALID: dict[int | str, dict[str, Any]] = {422: error("the request is invalid; `detail` says how")}
BINARY_BODY = {413: error("the body is larger than A3C_MAX_BODY_BYTES"), **INVALID}
JSON_BODY = {400: error("the body cannot be parsed"), **BINARY_BODY}


def conflict(when: str) -> dict[int | str, dict[str, Any]]:
    return {409: error(when)}


# Declares the token in the OpenAPI schema, so that /docs offers "Authorize" and sends it; `Auth`
# enforces it (this dependency never refuses anything itself).
bearer = HTTPBearer(
    auto_error=False,
    scheme_name="A3C_TOKEN",
    description="The A3C_TOKEN shared by the master and the workers.",
)


def protected_router(**kwargs: Any) -> APIRouter:
    """A router whose routes declare the token and the errors of `Auth`."""
    return APIRouter(dependencies=[Security(bearer)], responses=AUTH_ERRORS, **kwargs)


class QuietAccessLog(logging.Filter):
    """Leaves out uvicorn's access line of a successful request to one of `paths`, and of a 409
    to one of `conflicts`: a master serving hundreds of gradient pushes a second would otherwise
    spend a good part of its time writing them, and its refusals of stale pushes (a thousand
    after a restart) are counted elsewhere (A3C_ACCESS_LOG=all keeps them). Other errors and
    every other route are logged as ever."""

    def __init__(self, paths: set[str], conflicts: set[str] | None = None) -> None:
        super().__init__()
        self.paths = frozenset(paths)
        self.conflicts = frozenset(conflicts or ())

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn's access record: (client, method, path with query, HTTP version, status)
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[4], int):
            path, status = str(args[2]).partition("?")[0], args[4]
            if path in self.paths and status < 400:
                return False
            return not (path in self.conflicts and status == 409)
        return True


def quiet_access_log(paths: set[str], conflicts: set[str] | None = None) -> None:
    """Install `QuietAccessLog` on uvicorn's access logger (once per process)."""
    logger = logging.getLogger("uvicorn.access")
    for old in [f for f in logger.filters if isinstance(f, QuietAccessLog)]:
        logger.removeFilter(old)
    logger.addFilter(QuietAccessLog(paths, conflicts))


def install_common(
    app: FastAPI,
    token: str | None,
    max_body_bytes: int,
    quiet_paths: set[str] | None = None,
    public_paths: frozenset[str] = frozenset(),
    quiet_conflicts: set[str] | None = None,
) -> None:
    """Health route, API docs (a3c_http/apidocs.py), auth, body limit, the 422 format and the
    405's `Allow` shared by both services (the routes declare the errors they answer:
    `protected_router`, `JSON_BODY`, ...); `quiet_paths`: routes whose successful requests
    uvicorn's access log leaves out, and `quiet_conflicts` those whose 409s it leaves out too;
    `public_paths`: static pages served without the token (GET and HEAD only), besides Swagger
    UI's files."""
    if quiet_paths:
        quiet_access_log(quiet_paths, quiet_conflicts)
    app.include_router(health_router)
    apidocs.install(app)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    # Added last, so it runs first: a request without the right token is refused before its body
    # is read or its size is judged.
    app.add_middleware(Auth, token=token, public=public_paths | apidocs.PUBLIC_PATHS)
