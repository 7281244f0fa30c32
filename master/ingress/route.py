"""The ASGI route of every push (`POST /gradients`, `POST /experience`): what the master's port and
its receivers both serve (master/ingress/updates.py takes the master's pushes; a receiver
forwards them to the master, master/ingress/receiver.py). Torch-free, as a receiver is: it reads
the headers into one model (master/api/headers.py `PushHeaders`) and the body, and answers with
what its `push` replies."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from a3c_http.server.service import validation_body
from master.api.headers import PushHeaders

# The routes of the pushes.
PATHS = frozenset({"/gradients", "/experience"})
# PushHeaders's fields by the lower-case header names ASGI gives.
_ALIASES = {field.alias.lower(): field.alias for field in PushHeaders.model_fields.values()}

Reply = tuple[int, list[tuple[str, str]], bytes]


def json_reply(status: int, body: dict[str, Any], headers: list[tuple[str, str]] = ()) -> Reply:
    """A reply of `status` whose body is `body` as JSON (a refusal's `detail`, or a commit's)."""
    return status, [("content-type", "application/json"), *headers], json.dumps(body).encode()


Push = Callable[[str, PushHeaders, bytes], Awaitable[Reply]]


class UpdateRoute:
    """ASGI middleware: a `POST` to one of PATHS answered here (see the module's docstring) by
    `push` (the master's own: master/ingress/updates.py `push` bound to its state; a receiver's
    forwards it to the master, master/ingress/receiver.py); every other request goes on to the
    app."""

    def __init__(self, app: ASGIApp, push: Push) -> None:
        self.app = app
        self.push = push

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or path not in PATHS or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        given = {}
        for name, value in scope["headers"]:
            alias = _ALIASES.get(name.decode("latin-1"))
            if alias is not None:
                given[alias] = value.decode("latin-1")
        body = await body_of(receive)
        if body is None:  # the client left before its body was in: nothing to answer
            return
        try:
            headers = PushHeaders.model_validate(given)
        except ValidationError as exc:
            errors = [{**e, "loc": ("header", *e["loc"])} for e in exc.errors()]
            reply = json_reply(422, validation_body(errors))
        else:
            reply = await self.push(path, headers, body)
        await send_reply(send, reply)


async def send_reply(send: Send, reply: Reply) -> None:
    """A reply's status, headers (with its length) and body, in two messages."""
    status, headers_out, content = reply
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers_out]
    raw.append((b"content-length", str(len(content)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})


async def body_of(receive: Receive) -> bytes | bytearray | None:
    """The request's whole body (its size and time are bounded by the body limit outside), or
    None when the client left first. A body in several chunks is joined into a bytearray,
    which the decoder of a gradient push then takes as the vector's memory (a3c_http/wire/tensors.py
    `Layout.decode`): one pass over a large model's body instead of two."""
    chunks: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else bytearray().join(chunks)
