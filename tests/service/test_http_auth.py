"""The token on every route and method of both services, in-process (TestClient): without
it, or with any wrong credential, every request is a 401 naming A3C_TOKEN that changes nothing;
with it, no route is refused for it.

One real-process check of the token is in test_integration.py."""

from __future__ import annotations

import base64
from typing import Any

from fastapi.testclient import TestClient

from a3c_http.server import apidocs
from master.api.view import PUBLIC_PATHS
from tests.support.common import TOKEN, registry, snapshot
from tests.support.http_layer import GOOD_BODIES
from tests.support.http_layer import _clean_env as _clean_env
from tests.support.http_layer import master as master
from tests.support.http_layer import worker as worker

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
JSON = {"Content-Type": "application/json"}
# Paths beyond the schema's that must be refused the same way: docs, unknown, tricky spellings.
EXTRA_PATHS = ("/openapi.json", "/docs", "/redoc", "/", "/no/such/route", "/healthz/../status",
               "/STATUS")
# Every way of not presenting the token.
WRONG_CREDENTIALS = {
    "wrong token": "Bearer not-the-token",
    "token + suffix": f"Bearer {TOKEN}x",
    "token prefix": f"Bearer {TOKEN[:-1]}",
    "basic scheme": "Basic " + base64.b64encode(f"user:{TOKEN}".encode()).decode(),
    "token scheme": f"Token {TOKEN}",
    "raw token": TOKEN,
    "empty bearer": "Bearer",
}
def open_paths(c: TestClient) -> set[str]:
    """The paths open to GET and HEAD: /healthz, Swagger UI's files, and the master's dashboard
    page and files."""
    dashboard = PUBLIC_PATHS if hasattr(c.app.state, "cluster") else ()
    return {"/healthz", *apidocs.PUBLIC_PATHS, *dashboard}


def routes(c: TestClient) -> list[str]:
    """Every path but the open ones."""
    return sorted({*c.app.openapi()["paths"], *EXTRA_PATHS} - open_paths(c))


def refusals(c: TestClient) -> tuple[int, list[str]]:
    """Send, without the right token: every method to every path (with a well-formed body where
    one fits), every wrong credential to every path, the token in the query string, and every
    path as another site's page would (text/plain, its Origin: the token is judged first, so
    those learn nothing but 401 either). Returns (requests sent, every answer that was not a
    proper 401)."""
    problems: list[str] = []
    sent = 0

    def check(method: str, path: str, label: str, **kwargs: Any) -> None:
        nonlocal sent
        sent += 1
        reply = c.request(method, path, **kwargs)
        what = f"{method} {path} ({label}): {reply.status_code} {reply.text[:100]}"
        if reply.status_code != 401:
            problems.append(what)
        elif reply.headers.get("www-authenticate") != "Bearer":
            problems.append(f"{what} without WWW-Authenticate: Bearer")
        elif method != "HEAD" and "A3C_TOKEN" not in reply.json()["detail"]:
            problems.append(f"{what}: the detail does not name A3C_TOKEN")

    none = {"Authorization": ""}  # overrides the client's own header: no credential at all
    opened = open_paths(c)
    for path in [*routes(c), *sorted(opened)]:
        body = GOOD_BODIES.get(path.split("?")[0])
        for method in METHODS:
            if path in opened and method in ("GET", "HEAD"):
                continue
            json_body = body if method in ("POST", "PUT", "PATCH") else None
            check(method, path, "no token", headers=none, json=json_body)
    for path in routes(c):
        body = GOOD_BODIES.get(path)
        method = "POST" if body is not None or "weights" in path or path == "/gradients" else "GET"
        for label, value in WRONG_CREDENTIALS.items():
            check(method, path, label, headers={"Authorization": value}, json=body)
    check("GET", f"/status?token={TOKEN}&access_token={TOKEN}", "token in the query",
          headers=none)
    page = {**none, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site",
            "Content-Type": "text/plain", "Host": "evil.example"}
    for path in routes(c):
        check("POST", path, "another site's page", headers=page, content=b"{}")
    return sent, problems


def test_every_route_and_method_of_the_master_needs_the_token(master: TestClient) -> None:
    before = snapshot(master)
    sent, problems = refusals(master)
    assert sent > 300 and not problems, "\n".join(problems)
    # Nothing they carried reached the state.
    after = snapshot(master)
    assert after == before
    assert "intruder" not in registry(master.get("/status").json())
    assert master.get("/healthz", headers={"Authorization": ""}).json() == {"status": "ok"}
    # With the token no route is refused for it (some for their own reasons), none fails.
    for path in master.app.openapi()["paths"]:
        for method in master.app.openapi()["paths"][path]:
            reply = master.request(method.upper(), path, headers=JSON)
            assert reply.status_code not in (401, 403, 415) and reply.status_code < 500, (
                method, path, reply.status_code, reply.text[:200])
    assert master.get("/no/such/route").status_code == 404


def test_every_route_and_method_of_the_worker_needs_the_token(worker: TestClient) -> None:
    sent, problems = refusals(worker)
    assert sent > 100 and not problems, "\n".join(problems)
    status = worker.get("/status").json()
    assert status["state"] == "idle" and status["worker_id"] != "intruder", status
    assert worker.get("/healthz", headers={"Authorization": ""}).json() == {"status": "ok"}
    assert worker.get("/openapi.json").status_code == 200
    assert worker.get("/no/such/route").status_code == 404
