"""The ASGI route of a push's commit in a run with parameter-server shards (`POST /shards/commit`,
declared in master/api/shards.py): answered here, as a gradient push is (route.py), without
FastAPI's router, its dependencies and its thread pool, which were most of what a commit cost the
master (master/shards/__init__.py: a push crosses the master only as this small JSON body)."""

from __future__ import annotations

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from a3c_http.server.service import validation_body
from a3c_http.wire.protocol import SHARDS_PATH, STOP_HEADER
from a3c_http.wire.tensors import WireError
from master.api.shards import Commit
from master.errors import Invalid, StateConflict, Unavailable
from master.ingress.route import Reply, body_of, json_reply, send_reply
from master.state import ClusterState

PATH = f"{SHARDS_PATH}/commit"


class CommitRoute:
    """ASGI middleware: `POST /shards/commit` taken by the state's `commit_sharded` on the event
    loop (it waits for nothing but the state's locks); every other request goes on to the app."""

    def __init__(self, app: ASGIApp, state: ClusterState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await body_of(receive)
        if body is None:  # the client left before its body was in
            return
        await send_reply(send, self._answer(body))

    def _answer(self, body: bytes | bytearray) -> Reply:
        try:
            commit = Commit.model_validate_json(body)
        except ValidationError as exc:
            errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
            return json_reply(422, validation_body(errors))
        try:
            return json_reply(200, self.state.commit_sharded(commit))
        except StateConflict as exc:
            stop = [(STOP_HEADER, "1")] if exc.stop else []
            return json_reply(409, {"detail": str(exc)}, stop)
        except (Invalid, WireError) as exc:
            return json_reply(422, {"detail": str(exc)})
        except Unavailable as exc:
            return json_reply(503, {"detail": str(exc)}, [("retry-after", str(exc.retry_after_s))])
