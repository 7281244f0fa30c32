"""What a web page could send, refused by both services before routing, in-process (TestClient,
which sets Host, Origin, Sec-Fetch-Site and the client's address as a browser would): without a
token, a Host that does not name the service (DNS rebinding); with or without one, a request
from another site's page (Sec-Fetch-Site, Origin); and a state-changing request whose
Content-Type a page can send without asking first. None of them changes anything; what our own
clients and the dashboard send passes.

The bounds on request heads, which only uvicorn itself shows, are in test_http_head_bounds.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from master.api.headers import TENSOR_PATHS
from tests.support.common import OCTET, snapshot
from tests.support.http_layer import ALLOWED_HOST, GOOD_BODIES
from tests.support.http_layer import _clean_env as _clean_env
from tests.support.http_layer import master as master
from tests.support.http_layer import open_master as open_master
from tests.support.http_layer import open_worker as open_worker
from tests.support.http_layer import worker as worker

JSON = {"Content-Type": "application/json"}
# Hosts a tokenless service answers to: loopback literals, localhost and names under .localhost,
# the address the connection arrived on (TestClient's is "testserver"), A3C_ALLOWED_HOSTS.
OWN_HOSTS = ("127.0.0.1", "127.0.0.1:33333", "127.9.8.7:1", "[::1]:8001", "[::1]", "localhost",
             "LOCALHOST:8001", "localhost.", "dashboard.localhost:8001", "testserver",
             f"{ALLOWED_HOST}:33333")
# And hosts it does not: a rebinding page's own name first, then look-alikes.
OTHER_HOSTS = ("rebind.test:33333", "evil.example", "127.0.0.1.evil.example", "localhost.evil",
               "evillocalhost", f"{ALLOWED_HOST}.evil", "10.0.0.1:33333", "[::2]:8001")
# What a browser sends with a request from another site's page (fetch, an <img>, a form).
OTHER_SITES = {
    "cross-site": {"Sec-Fetch-Site": "cross-site"},
    "same-site (another port of localhost)": {"Sec-Fetch-Site": "same-site"},
    "another origin": {"Origin": "http://evil.example"},
    "an opaque origin": {"Origin": "null"},
    "this host on another port": {"Origin": "http://testserver:8080"},
    "this host over https": {"Origin": "https://testserver"},
    "another loopback name": {"Origin": "http://127.0.0.1"},
}
# And what it sends with requests of this service's own page, or one the user typed.
OWN_SITE = {
    "same-origin": {"Sec-Fetch-Site": "same-origin", "Origin": "http://testserver"},
    "typed": {"Sec-Fetch-Site": "none"},
    "own origin, port 80 spelled out": {"Origin": "http://testserver:80"},
}
SIMPLE_TYPES = (None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x")


def requests_of(c: TestClient) -> list[tuple[str, str, dict[str, Any]]]:
    """What a page tried: read the state and the weights, pop the queue, start a run pointed
    elsewhere, stop it, replace the weights (master); read, start and stop the worker."""
    if not hasattr(c.app.state, "cluster"):
        start = {"json": GOOD_BODIES["/start_worker"]}
        return [("GET", "/status", {}), ("POST", "/start_worker", start),
                ("POST", "/stop", {"json": {}})]
    weights = c.get("/global_model_weights").content
    return [
        ("GET", "/status", {}),
        ("GET", "/global_model_weights", {}),
        ("GET", "/queue", {}),
        ("POST", "/train", {"json": {**GOOD_BODIES["/train"], "master_url": "http://evil:1"}}),
        ("POST", "/stop", {"json": {}}),
        ("POST", "/local_model_weights?worker_id=w1&temporary=false",
         {"content": weights, "headers": OCTET}),
    ]


def state_of(c: TestClient) -> Any:
    return snapshot(c) if hasattr(c.app.state, "cluster") else c.get("/status").json()


def refuse_all(c: TestClient, headers: dict[str, str], status: int, words: tuple[str, ...]) -> None:
    for method, path, kwargs in requests_of(c):
        sent = {**kwargs.get("headers", {}), **headers}
        reply = c.request(method, path, **{**kwargs, "headers": sent})
        what = (method, path, headers, reply.status_code, reply.text[:200])
        assert reply.status_code == status, what
        assert all(w in reply.json()["detail"] for w in words), what


@pytest.mark.parametrize("service", ["open_master", "open_worker"])
def test_without_a_token_only_requests_addressed_to_the_service_are_served(
    service: str, request: pytest.FixtureRequest
) -> None:
    c: TestClient = request.getfixturevalue(service)
    before = state_of(c)
    for host in OTHER_HOSTS:
        refuse_all(c, {"Host": host}, 403, (repr(host), "127.0.0.1", "A3C_ALLOWED_HOSTS"))
        assert c.get("/healthz", headers={"Host": host}).status_code == 200  # probes
    assert state_of(c) == before
    for host in OWN_HOSTS:
        assert c.get("/status", headers={"Host": host}).status_code == 200, host


def test_with_a_token_any_host_is_served(master: TestClient, worker: TestClient) -> None:
    # Clusters and Kubernetes reach the services by names nobody can list; a page lacks the token.
    for c in (master, worker):
        assert c.get("/status", headers={"Host": "a3c-master.svc:33333"}).status_code == 200


@pytest.mark.parametrize("service", ["master", "worker", "open_master", "open_worker"])
def test_pages_of_other_sites_are_refused_with_or_without_a_token(
    service: str, request: pytest.FixtureRequest
) -> None:
    c: TestClient = request.getfixturevalue(service)
    before = state_of(c)
    for label, headers in OTHER_SITES.items():
        refuse_all(c, headers, 403, ("another site's page",))
        assert c.get("/healthz", headers=headers).status_code == 200, label
    assert state_of(c) == before
    for label, headers in OWN_SITE.items():
        assert c.get("/status", headers=headers).status_code == 200, label
        assert c.post("/stop", json={}, headers=headers).status_code in (200, 202), label
    if service.startswith("open_"):  # a page of an A3C_ALLOWED_HOSTS name may call it
        allowed = {"Origin": f"https://{ALLOWED_HOST}:8443"}
        assert c.get("/status", headers=allowed).status_code == 200
    if service.endswith("master"):  # a link from another site opens the dashboard page
        assert c.get("/", headers=OTHER_SITES["cross-site"]).status_code == 200


@pytest.mark.parametrize("service", ["master", "worker"])
def test_a_state_changing_request_needs_a_content_type_a_page_cannot_send_unasked(
    service: str, request: pytest.FixtureRequest
) -> None:
    c: TestClient = request.getfixturevalue(service)
    before = state_of(c)
    weights = c.get("/global_model_weights").content if service == "master" else b""
    paths = c.app.openapi()["paths"]
    tried = 0
    for path, operations in paths.items():
        for method in {m.upper() for m in operations} - {"GET", "HEAD", "OPTIONS"}:
            tensors = path in TENSOR_PATHS
            want = "application/octet-stream" if tensors else "application/json"
            url = f"{path}?worker_id=w1&temporary=false" if path == "/local_model_weights" else path
            body = weights if tensors else json.dumps(GOOD_BODIES.get(path, {})).encode()
            for content_type in SIMPLE_TYPES:
                headers = {"Content-Type": content_type} if content_type else {}
                reply = c.request(method, url, content=body, headers=headers)
                what = (method, path, content_type, reply.status_code, reply.text[:200])
                assert reply.status_code == 415, what
                detail = reply.json()["detail"]
                assert f"{method} {path} needs 'Content-Type: {want}'" in detail, what
                assert f"with curl: -H 'Content-Type: {want}'" in detail, what
                tried += 1
    assert tried >= len(SIMPLE_TYPES) * (13 if service == "master" else 2)
    assert state_of(c) == before
    # The same requests pass with the content type our clients send, body-less ones too.
    assert c.post("/stop", json={}).status_code in (200, 202)
    assert c.post("/stop", headers=JSON).status_code in (200, 202)
    # A method or path that takes nothing keeps its 405 or 404: it changes nothing.
    assert c.put("/status").status_code == 405
    assert c.post("/no/such/route").status_code == 404

