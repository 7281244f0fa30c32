"""A master on a "host" of its own, a Linux network namespace with its own address (the network and
its teardown: tests/support/netns.py; skipped with the reason where namespaces cannot be made):
without a token it serves its own loopback only. A run across three such hosts, whose counts add
up and which needs the token from every other host: tests/ops/test_hosts.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.netns import Net, NsService, Services
from tests.support.netns import net as net
from tests.support.netns import services as services

pytestmark = pytest.mark.integration

MASTER_PORT = 33333
WORKER_PORT = 8001
RUN_TIMEOUT_S = 120


def request_from(net: Net, role: str, requests: list[tuple[str, str]]) -> list[dict]:
    """Send each (method, url), without a token, from a process in `role`'s namespace; returns
    [{"status", "www_authenticate", "body"}] in order."""
    script = """
import json, sys, urllib.error, urllib.request
out = []
for method, url in json.loads(sys.argv[1]):
    req = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, headers, body = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, headers, body = e.code, e.headers, e.read()
    out.append({"status": status, "www_authenticate": headers.get("WWW-Authenticate"),
                "body": json.loads(body or b"null")})
print(json.dumps(out))
"""
    done = subprocess.run(
        [*net.exec_prefix(role), sys.executable, "-c", script, json.dumps(requests)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_master_without_a_token_serves_loopback_only(
    net: Net, services: Services, tmp_path: Path
) -> None:
    port = MASTER_PORT + 1
    master = NsService(
        net,
        "m",
        "master.app:app",
        port,
        tmp_path / "master.log",
        env={"A3C_TOKEN": "", "A3C_RUN_DIR": str(tmp_path / "run")},
    )
    services.start(master)

    # From another host (this test's namespace): 403 that says how to set the token; /healthz ok.
    with httpx.Client(timeout=30, trust_env=False) as http:
        for method in ("GET", "POST"):
            path = "/status" if method == "GET" else "/train"
            r = http.request(method, f"{master.url}{path}", json=None if method == "GET" else {})
            assert r.status_code == 403, (method, path, r.status_code, r.text)
            detail = r.json()["detail"]
            assert "A3C_TOKEN" in detail and "set" in detail, detail
        health = http.get(f"{master.url}/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}

    # On the master's own host: served over loopback, refused over its network address.
    loopback, own_address = request_from(
        net, "m", [("GET", f"http://127.0.0.1:{port}/status"), ("GET", f"{master.url}/status")]
    )
    assert loopback["status"] == 200 and loopback["body"]["state"] == "idle", loopback
    assert own_address["status"] == 403, own_address
