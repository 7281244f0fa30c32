"""Watching a run: the dashboard page at `/` (master/api/dashboard/, served from the package:
nothing comes from the internet) and the history it draws its curve from, page by page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from a3c_http.server.service import INVALID, protected_router
from a3c_http.wire.protocol import MAX_SQLITE_INT
from master.api.deps import State
from master.api.history import MAX_LIMIT, history_page

ASSETS = Path(__file__).with_name("dashboard")
# The page and its files, by path: served to anyone (a3c_http/server/edge.py `Gate`), since
# they hold no data; the page asks for the token and sends it in a header, never in a URL.
PAGES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/dashboard/chart.js": ("chart.js", "text/javascript; charset=utf-8"),
    "/dashboard/style.css": ("style.css", "text/css; charset=utf-8"),
}
PUBLIC_PATHS = frozenset(PAGES)
# The page runs only its own files and talks only to this master.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}

pages = APIRouter(include_in_schema=False)
router = protected_router(tags=["run"])


def _serve(path: str) -> None:
    name, media_type = PAGES[path]
    body = (ASSETS / name).read_bytes()

    async def page() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    pages.add_api_route(path, page, methods=["GET", "HEAD"], name=name)


for _path in PAGES:
    _serve(_path)


# A row number: no row is numbered past SQLite's integers, and a larger one would overflow there.
RowNumber = Annotated[int, Query(ge=0, le=MAX_SQLITE_INT)]


@router.get("/history", responses=INVALID)
def history(
    state: State,
    since: Annotated[RowNumber, Query(description="the last episode number the client has")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="rows per page")] = 1000,
    evaluations_since: Annotated[
        RowNumber, Query(description="the last evaluation number the client has")
    ] = 0,
) -> dict[str, Any]:
    """The run's episodes numbered above `since` and evaluations above `evaluations_since`, at
    most `limit` of each, oldest first; ask again with `since=next` and
    `evaluations_since=evaluations_next` while `more` is true, and after that to follow the run.
    A changed `run_id` means a new run: start again from 0."""
    return history_page(state, since, limit, evaluations_since)
