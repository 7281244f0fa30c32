"""The interactive API docs at `/docs`, on the master and the workers, without the internet:
FastAPI's own `/docs` page loads Swagger UI's script and styles from a CDN (a blank page on a
cluster that cannot reach it), so both services serve them from an installed package instead
(`swagger-ui-bundle-v2`, imported as `swagger_ui_bundle`: Swagger UI 5's files, nothing else;
Swagger UI 4 cannot show our OpenAPI 3.1 schemas). ReDoc (`/redoc`) would load from a CDN too,
and is turned off.

The page itself needs the token like every route (its schema, `/openapi.json`, does); Swagger UI's
files are served without it, as the dashboard's are: they are the package's, the same for every
cluster, and hold no data.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from swagger_ui_bundle import swagger_ui_path

DOCS_PATH = "/docs"
# Swagger UI's files, by the path they are served at: (file of the package, media type).
FILES = {
    "/docs/swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "/docs/swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
    "/docs/favicon.png": ("favicon-32x32.png", "image/png"),
}
PUBLIC_PATHS = frozenset(FILES)


def install(app: FastAPI) -> None:
    """Add `/docs` and Swagger UI's files to an app made with `docs_url=None, redoc_url=None`."""
    router = APIRouter(include_in_schema=False)
    folder = Path(swagger_ui_path)

    @router.get(DOCS_PATH)
    async def docs(request: Request) -> HTMLResponse:
        # Behind a proxy that serves the app under a prefix, every URL carries it (as FastAPI's).
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + (app.openapi_url or "/openapi.json"),
            title=f"{app.title} - API docs",
            swagger_js_url=root + "/docs/swagger-ui-bundle.js",
            swagger_css_url=root + "/docs/swagger-ui.css",
            swagger_favicon_url=root + "/docs/favicon.png",
        )

    for path, (name, media_type) in FILES.items():
        _serve(router, path, folder / name, media_type)
    app.include_router(router)


def _serve(router: APIRouter, path: str, file: Path, media_type: str) -> None:
    async def asset() -> FileResponse:
        return FileResponse(file, media_type=media_type)

    router.add_api_route(path, asset, methods=["GET", "HEAD"], name=file.name)
