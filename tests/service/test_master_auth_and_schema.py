"""The master's HTTP API: who it serves (the bearer token, or loopback clients when it has
none; /healthz for anyone) and its OpenAPI schema (every error declared on the routes
themselves, the bearer token offered to /docs, and /docs itself, the worker's too). In-process
(TestClient)."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.openapi.utils import get_openapi
from fastapi.testclient import TestClient

from a3c_http.server import apidocs
from master.app import create_app
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import make_settings, master, status
from tests.support.schema_checks import assert_bearer_everywhere_but_healthz, assert_errors_declared
from worker.app import create_app as create_worker

REMOTE = ("10.1.2.3", 5)


def raw_json(c: TestClient, path: str, text: str):
    return c.post(path, content=text.encode(), headers={"content-type": "application/json"})


def api_routes(c: TestClient) -> list[tuple[str, str]]:
    """Every (method, path) of the API but /healthz, from the app's OpenAPI schema."""
    paths = c.app.openapi()["paths"]
    return [
        (method.upper(), path)
        for path, operations in paths.items()
        if path != "/healthz"
        for method in operations
    ]


# -- health and auth -------------------------------------------------------------------------


def test_healthz_needs_no_auth(tmp_path: Path) -> None:
    with master(make_settings(tmp_path, token="s3cret"), client=REMOTE) as c:
        r = c.get("/healthz")
        assert r.status_code == 200
        assert r.json() == {"status": "ok"}
    with master(make_settings(tmp_path), client=REMOTE) as c:
        assert c.get("/healthz").json() == {"status": "ok"}


def test_the_right_token_is_served_from_anywhere(tmp_path: Path) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    with master(make_settings(tmp_path, token="s3cret"), client=REMOTE, headers=auth) as c:
        for method, path in api_routes(c):
            r = c.request(method, path, headers={"Content-Type": "application/json"})
            assert r.status_code not in (401, 403, 415), (method, path, r.text)
        assert status(c)["state"] == "idle"
        assert c.get("/global_episode").json() == {"data": 1}  # the loop's POST counted
        assert c.post("/global_episode", json={}).json() == {"data": 2}


def test_without_token_remote_clients_get_403(tmp_path: Path) -> None:
    with master(make_settings(tmp_path), client=REMOTE) as c:
        for method, path in api_routes(c):
            r = c.request(method, path)
            assert r.status_code == 403, (method, path, r.text)
            assert "A3C_TOKEN" in r.json()["detail"]


def test_without_token_ipv6_loopback_is_served(tmp_path: Path) -> None:
    with master(make_settings(tmp_path), client=("::1", 5)) as c:
        assert c.get("/global_episode").status_code == 200


def test_malformed_json_without_token_is_401_not_422(tmp_path: Path) -> None:
    with master(make_settings(tmp_path, token="s3cret")) as c:
        r = raw_json(c, "/episode", "{not json")
        assert r.status_code == 401, r.text


# -- the OpenAPI schema ----------------------------------------------------------------------------

# The operations that may answer 409, and only those declare it.
CONFLICT_OPERATIONS = {
    ("POST", "/train"),
    ("POST", "/join"),
    ("POST", "/worker_started"),
    ("POST", "/worker_done"),
    ("POST", "/episode"),
    ("POST", "/heartbeat"),
    ("GET", "/global_model_weights"),
    ("GET", "/target_model_weights"),
    ("POST", "/local_model_weights"),
    ("POST", "/gradients"),
    ("POST", "/experience"),
    ("GET", "/shards"),
    ("POST", "/shards/commit"),
}


def test_the_routes_themselves_declare_every_error(tmp_path: Path) -> None:
    """The errors are declared with FastAPI's `responses=` on the routes: the schema FastAPI makes
    from the routes alone is the one the app serves, nothing patched on top."""
    app = create_app(make_settings(tmp_path))
    from_routes = get_openapi(title=app.title, version=app.version, routes=app.routes)
    served = app.openapi()
    assert served["paths"] == from_routes["paths"]
    assert served["components"] == from_routes["components"]
    assert_errors_declared(from_routes, CONFLICT_OPERATIONS)


def test_the_schema_offers_the_bearer_token_to_docs(tmp_path: Path) -> None:
    """/docs shows "Authorize" and sends `Authorization: Bearer ...` with every request it makes."""
    with master(make_settings(tmp_path, token="s3cret")) as c:
        r = c.get("/openapi.json", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        assert_bearer_everywhere_but_healthz(r.json())
        assert c.get("/openapi.json").status_code == 401  # enforcement is unchanged


def test_docs_load_only_files_served_by_the_service_itself(tmp_path: Path) -> None:
    """/docs works without the internet: its page refers to nothing but Swagger UI's files,
    which both services serve (without the token, as the dashboard's: they hold no data), and the
    schema (with it); no /redoc, which would need a CDN."""
    auth = {"Authorization": "Bearer s3cret"}
    kinds = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
    for app in (create_app(make_settings(tmp_path, token="s3cret")), create_worker("s3cret")):
        with TestClient(app, client=REMOTE) as c:
            page = c.get("/docs", headers=auth)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert "://" not in page.text, page.text  # no CDN, no absolute URL at all
            loaded = set(re.findall(r'(?:src|href)="([^"]+)"', page.text))
            assert loaded == set(apidocs.PUBLIC_PATHS), loaded
            assert re.findall(r"url: '([^']+)'", page.text) == ["/openapi.json"]
            for path in loaded:
                r = c.get(path)
                kind = kinds[path[path.rindex("."):]]
                assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
                assert len(r.content) > 500, path
            assert c.get("/docs").status_code == 401  # the page, as its schema, needs the token
            assert c.get("/redoc", headers=auth).status_code == 404
    # Swagger UI shows OpenAPI 3.1, the version of our schemas, from its version 5 on.
    assert app.openapi()["openapi"].startswith("3.1.")
    version = re.search(r"swagger-ui-(\d+)\.", Path(apidocs.swagger_ui_path).name)
    assert version and int(version[1]) >= 5, apidocs.swagger_ui_path
