"""A master and two workers on three "hosts": each a uvicorn process in its own Linux network
namespace with its own address, as README's "On several hosts" runs them (the network and its
teardown: tests/support/netns.py; skipped with the reason where namespaces cannot be made).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from a3c_http.local.cluster import wait_for
from tests.support.common import SHORT_RUN
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


def test_a_run_across_three_namespaces_adds_up_and_needs_the_token(
    net: Net, services: Services, tmp_path: Path
) -> None:
    token = secrets.token_urlsafe(24)
    workers_file = tmp_path / "workers.txt"
    workers_file.write_text("# empty: the test passes the workers in POST /train\n")
    master = NsService(
        net,
        "m",
        "master.app:app",
        MASTER_PORT,
        tmp_path / "master.log",
        token=token,
        env={"A3C_RUN_DIR": str(tmp_path / "run"), "A3C_WORKERS_FILE": str(workers_file)},
    )
    workers = [
        NsService(net, role, "worker.app:app", WORKER_PORT, tmp_path / f"{role}.log", token=token)
        for role in ("w1", "w2")
    ]
    services.start(master, *workers)
    worker_urls = [w.url for w in workers]

    http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30, trust_env=False)
    with http:
        reply = http.post(
            f"{master.url}/train",
            json={**SHORT_RUN, "workers": worker_urls, "master_url": master.url},
        )
        assert reply.status_code == 202, reply.text
        data = reply.json()["data"]
        assert data["master_url"] == master.url
        assert [(w["url"], w["started"]) for w in data["workers"]] == [
            (u, True) for u in worker_urls
        ], data

        def status() -> dict:
            return http.get(f"{master.url}/status").json()

        finished = wait_for(
            lambda: (s := status())["state"] == "finished" and s,
            RUN_TIMEOUT_S,
            "the run to finish",
        )
        assert finished["finish_reason"].startswith("max_episodes"), finished

        def workers_done() -> list[dict] | None:
            ws = [http.get(f"{w.url}/status").json() for w in workers]
            return ws if all(s["state"] == "done" for s in ws) else None

        worker_statuses = wait_for(workers_done, 60, "both workers to be done")
        final = wait_for(
            lambda: (s := status()) and {w["state"] for w in s["workers"]} == {"done"} and s,
            30,
            "the master to see both workers done",
        )

    # The master's registry: both workers, under the addresses they were started at, took part,
    # and their episodes add up to the global count.
    records = {r["url"]: r for r in final["workers"]}
    assert sorted(records) == sorted(worker_urls), final["workers"]
    assert all(r["episodes"] > 0 for r in records.values()), final["workers"]
    assert sum(r["episodes"] for r in records.values()) == final["global_episode"] >= 40
    assert sum(r["steps"] for r in records.values()) == final["global_steps"]
    # Each worker, asked at its own address, is done, worked for the master namespace's URL, and
    # counts the episodes the master credited it with.
    for w, ws in zip(workers, worker_statuses, strict=True):
        assert ws["state"] == "done" and ws["error"] is None, ws
        assert ws["master_url"] == f"http://{net.addresses['m']}:{MASTER_PORT}", ws
        assert ws["episodes"] == records[w.url]["episodes"], (ws, records[w.url])

    # Without the token, from other namespaces (this test's, and a worker host's): 401, Bearer.
    anonymous = httpx.Client(timeout=30, trust_env=False)
    with anonymous:
        for url in (f"{master.url}/status", f"{workers[0].url}/status"):
            r = anonymous.get(url)
            assert r.status_code == 401, (url, r.status_code, r.text)
            assert r.headers.get("WWW-Authenticate") == "Bearer", r.headers
        r = anonymous.post(f"{master.url}/train", json=SHORT_RUN)
        assert r.status_code == 401, r.text
        assert anonymous.get(f"{master.url}/healthz").status_code == 200
    for answer in request_from(
        net, "w1", [("GET", f"{master.url}/status"), ("POST", f"{master.url}/stop")]
    ):
        assert answer["status"] == 401 and answer["www_authenticate"] == "Bearer", answer


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
