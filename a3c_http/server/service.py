"""What the master and the workers share as HTTP services: the gate every request passes
(a3c_http/server/edge.py), the bounds on a request's head (a3c_http/tuning/) and
body, one send for a message's head and body (a3c_http/tuning/), readable validation
errors, the errors their OpenAPI schemas declare and the health route. The services import this
module, never each other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Security
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from a3c_http import tuning
from a3c_http.config.settings import Settings, WorkerSettings
from a3c_http.server import apidocs
from a3c_http.server.edge import SAFE_METHODS, Gate

health_router = APIRouter()


@health_router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@health_router.head("/healthz", include_in_schema=False)
def healthz_head() -> dict[str, str]:
    return {"status": "ok"}  # uvicorn sends the headers only


class BodyLimit:
    """ASGI middleware: 413 for bodies over `max_bytes`, before they are read whole, whether they
    announce a Content-Length or arrive chunked; 408 for a body not received within `timeout_s`
    of the request's start (a client that sends a head and then trickles its body, or stops,
    would otherwise hold its request and its memory for ever). A chunked body is cut off as soon
    as it passes the limit: the 413 is sent at once, and whatever the app does with the cut body
    (FastAPI would answer 400 to a JSON body it could not read) is dropped."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 60.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send, 413)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        seen = 0
        started = rejected = whole = False

        async def limited_receive() -> Message:
            nonlocal seen, rejected, whole
            if whole:  # the body is in: what comes now is the disconnect, whenever it comes
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                if not started and not rejected:
                    rejected = True
                    await self._reject(send, 408)
                raise _Refused from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                whole = not message.get("more_body", False)
                if seen > self.max_bytes:
                    if not started and not rejected:
                        rejected = True
                        await self._reject(send, 413)
                    raise _Refused
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if rejected:
                return  # the 413 or 408 went out already
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not rejected:
                raise

    async def _reject(self, send: Send, status: int) -> None:
        if status == 413:
            detail = f"request body larger than {self.max_bytes} bytes (A3C_MAX_BODY_BYTES)"
            headers = None
        else:
            detail = (
                f"the request body did not arrive within {self.timeout_s:g} s "
                "(A3C_BODY_TIMEOUT_S): send it at once, or raise the setting for a slow link"
            )
            headers = {"Connection": "close"}  # the rest of it may still be on its way
        response = JSONResponse({"detail": detail}, status_code=status, headers=headers)
        await response({"type": "http"}, _no_receive, send)


class _Refused(Exception):
    pass


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def describe_error(error: dict, whole: str = "body") -> str:
    """One pydantic error as `where: what`, as every 422 of both services names it (`whole`:
    what names an error of no one field)."""
    if error.get("type") == "json_invalid":  # FastAPI's: its loc is ("body", character offset)
        why = (error.get("ctx") or {}).get("error", "JSON decode error")
        where = [p for p in error.get("loc", ()) if isinstance(p, int)]
        at = f" at position {where[0]}" if where else ""
        return (
            f"the body is not valid JSON ({why}{at}): send a JSON object with "
            "Content-Type: application/json"
        )
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "header")]
    where = ".".join(loc) or whole
    return f"{where}: {error.get('msg', 'invalid')}"


def validation_body(errors: Sequence[Any]) -> dict[str, Any]:
    """The body of a 422 for pydantic's `errors`: `detail` names each problem, `errors` lists
    them (every 422 of a request that does not fit the schema has this body)."""
    message = "; ".join(describe_error(e) for e in errors) or "invalid request"
    safe = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in errors
    ]
    return {"detail": message, "errors": safe}


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse(validation_body(exc.errors()), status_code=422)


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


# Declared where they happen: AUTH_ERRORS on every router but /healthz's (`Gate`), and
# PAGE_ERRORS on their routes that change state; INVALID on routes with parameters or a body (our
# 422 body instead of FastAPI's); BINARY_BODY on those that take a body (`BodyLimit`); JSON_BODY
# on those that take JSON (FastAPI's 400 for a body it cannot parse); `conflict(when)` on those
# that answer 409.
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: error(
        "missing or wrong token: send `Authorization: Bearer <A3C_TOKEN>`",
        headers={"WWW-Authenticate": {"schema": {"type": "string"}}},
    ),
    403: error(
        "without A3C_TOKEN: the client is not loopback, or `Host` does not name this service "
        "(A3C_ALLOWED_HOSTS); with or without it: the request comes from another site's page "
        "(`Sec-Fetch-Site`, `Origin`)"
    ),
}
PAGE_ERRORS: dict[int | str, dict[str, Any]] = {
    415: error(
        "no Content-Type, or one a web page may send without asking first (text/plain, a form): "
        "send `Content-Type: application/json` (application/octet-stream for tensors)"
    ),
}
INVALID: dict[int | str, dict[str, Any]] = {422: error("the request is invalid; `detail` says how")}
BINARY_BODY = {
    408: error("the body did not arrive within A3C_BODY_TIMEOUT_S"),
    413: error("the body is larger than A3C_MAX_BODY_BYTES"),
    **INVALID,
}
JSON_BODY = {400: error("the body cannot be parsed"), **BINARY_BODY}


def conflict(when: str) -> dict[int | str, dict[str, Any]]:
    return {409: error(when)}


# Declares the token in the OpenAPI schema, so that /docs offers "Authorize" and sends it; `Gate`
# enforces it (this dependency never refuses anything itself).
bearer = HTTPBearer(
    auto_error=False,
    scheme_name="A3C_TOKEN",
    description="The A3C_TOKEN shared by the master and the workers.",
)


class _GatedRoute(APIRoute):
    """A route of `protected_router`: one that changes state also declares `Gate`'s 415."""

    def __init__(self, path: str, endpoint: Any, **kwargs: Any) -> None:
        if {m.upper() for m in kwargs.get("methods") or ()} - SAFE_METHODS:
            kwargs["responses"] = {**PAGE_ERRORS, **(kwargs.get("responses") or {})}
        super().__init__(path, endpoint, **kwargs)


def protected_router(**kwargs: Any) -> APIRouter:
    """A router whose routes declare the token and the errors of `Gate`."""
    return APIRouter(
        dependencies=[Security(bearer)], responses=AUTH_ERRORS, route_class=_GatedRoute, **kwargs
    )


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
    settings: Settings | WorkerSettings,
    quiet_paths: set[str] | None = None,
    public_paths: frozenset[str] = frozenset(),
    quiet_conflicts: set[str] | None = None,
    tensor_paths: frozenset[str] = frozenset(),
) -> None:
    """Health route, API docs (a3c_http/server/apidocs.py), the gate (token, Host, pages of other
    sites, content types), the bounds on heads and bodies, the 422 format and the 405's `Allow`
    shared by both services (the routes declare the errors they answer: `protected_router`,
    `JSON_BODY`, ...); `quiet_paths`: routes whose successful requests uvicorn's access log
    leaves out, and `quiet_conflicts` those whose 409s it leaves out too; `public_paths`: static
    pages served to anyone (GET and HEAD only), besides Swagger UI's files; `tensor_paths`:
    routes that take safetensors bodies."""
    if quiet_paths:
        quiet_access_log(quiet_paths, quiet_conflicts)
    tuning.bound_request_heads(settings.max_header_bytes, settings.header_timeout_s)
    tuning.install_server_hooks()
    app.include_router(health_router)
    apidocs.install(app)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s
    )
    # Added last, so it runs first: a request that does not pass is refused before its body is
    # read or its size is judged.
    app.add_middleware(
        Gate,
        token=settings.token,
        public=public_paths | apidocs.PUBLIC_PATHS,
        allowed_hosts=frozenset(settings.allowed_hosts),
        tensor_paths=tensor_paths,
    )
