"""A master and two workers on three "hosts": each a uvicorn process in its own Linux network
namespace with its own address, as README's "On several hosts" runs them.

The network, built once for this module with `ip` (unique names and subnet per run):

    root namespace (this test process, 10.231.N.1) --veth-- +
    a3c-<sfx>-m   master    10.231.N.10:33333     --veth-- + bridge br0 in its own
    a3c-<sfx>-w1  worker 1  10.231.N.11:8001      --veth-- + namespace a3c-<sfx>-br
    a3c-<sfx>-w2  worker 2  10.231.N.12:8001      --veth-- +

The test process reaches the services through its own veth into the bridge, so every request it
sends comes from another host's address (10.231.N.1), never from loopback: that is what the auth
checks need. N is picked at random among the 10.231.N.0/24 that nothing in the root namespace
uses. Each namespace has `lo` up. Services bind 0.0.0.0 as in the README and are started with
`ip netns exec <ns> python -m uvicorn ...` (which execs, so the pid we hold is uvicorn's).

Teardown, even after a failure: every process we started is ended by its pid (SIGTERM, then
SIGKILL), then the root-namespace veth and every namespace are deleted, and the test errors if
anything is left. Without root, `ip`, or the right to create namespaces, veths and bridges (an
unprivileged container), the tests are skipped with the reason.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from a3c_http.local.cluster import ServiceProcess, wait_for
from tests.support.common import SHORT_RUN

pytestmark = pytest.mark.integration

IP = shutil.which("ip")
MASTER_PORT = 33333
WORKER_PORT = 8001
# Generous: other test runs may share the 2 cores.
START_TIMEOUT_S = 90
RUN_TIMEOUT_S = 120


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([IP, *args], capture_output=True, text=True, timeout=30)


class NetworkUnavailable(Exception):
    """This machine does not let us build the test network."""


def ip_or_raise(*args: str) -> None:
    done = ip(*args)
    if done.returncode != 0:
        raise NetworkUnavailable(
            f"`ip {' '.join(args)}` failed (exit {done.returncode}): {done.stderr.strip()}"
        )


def unused_subnet() -> ipaddress.IPv4Network:
    """A random 10.231.N.0/24 that overlaps no address or route of the root namespace."""
    used: list[ipaddress.IPv4Network] = []
    for link in json.loads(ip("-j", "-4", "addr").stdout or "[]"):
        for a in link.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for route in json.loads(ip("-j", "-4", "route").stdout or "[]"):
        if route.get("dst", "default") != "default":
            used.append(ipaddress.ip_network(route["dst"], strict=False))
    candidates = [ipaddress.ip_network(f"10.231.{n}.0/24") for n in range(256)]
    free = [net for net in candidates if not any(net.overlaps(u) for u in used)]
    if not free:
        raise NetworkUnavailable("every 10.231.N.0/24 is already in use on this host")
    return random.choice(free)


@dataclass
class Net:
    suffix: str
    subnet: ipaddress.IPv4Network
    namespaces: dict[str, str] = field(default_factory=dict)  # role -> namespace name
    addresses: dict[str, str] = field(default_factory=dict)  # role -> IPv4 address
    root_link: str = ""
    created_namespaces: list[str] = field(default_factory=list)
    created_root_link: bool = False

    def exec_prefix(self, role: str) -> list[str]:
        return [IP, "netns", "exec", self.namespaces[role]]

    def build(self) -> None:
        hosts = list(self.subnet.hosts())
        self.addresses = {
            "test": str(hosts[0]),
            "m": str(hosts[9]),
            "w1": str(hosts[10]),
            "w2": str(hosts[11]),
        }
        for role in ("br", "m", "w1", "w2"):
            name = f"a3c-{self.suffix}-{role}"
            ip_or_raise("netns", "add", name)
            self.created_namespaces.append(name)
            self.namespaces[role] = name
            ip_or_raise("-n", name, "link", "set", "dev", "lo", "up")
        br = self.namespaces["br"]
        ip_or_raise("-n", br, "link", "add", "br0", "type", "bridge")
        ip_or_raise("-n", br, "link", "set", "dev", "br0", "up")

        def attach(port: str) -> None:
            ip_or_raise("-n", br, "link", "set", "dev", port, "master", "br0")
            ip_or_raise("-n", br, "link", "set", "dev", port, "up")

        for role in ("m", "w1", "w2"):
            ns = self.namespaces[role]
            # Created inside the host's namespace with its peer directly in the bridge's: no
            # interface ever appears in the root namespace.
            ip_or_raise(
                "-n",
                ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                f"v-{role}",
                "netns",
                br,
            )
            ip_or_raise("-n", ns, "addr", "add", f"{self.addresses[role]}/24", "dev", "eth0")
            ip_or_raise("-n", ns, "link", "set", "dev", "eth0", "up")
            attach(f"v-{role}")
        # The test process's own "host": a veth from the root namespace into the bridge.
        self.root_link = f"a3c-{self.suffix}"
        ip_or_raise(
            "link", "add", self.root_link, "type", "veth", "peer", "name", "v-up", "netns", br
        )
        self.created_root_link = True
        ip_or_raise("addr", "add", f"{self.addresses['test']}/24", "dev", self.root_link)
        ip_or_raise("link", "set", "dev", self.root_link, "up")
        attach("v-up")

    def teardown(self) -> list[str]:
        """Delete everything `build` made; returns what could not be cleaned up."""
        problems = []
        for name in self.created_namespaces:
            pids = ip("netns", "pids", name).stdout.split()
            if pids:
                problems.append(f"processes still in {name}: {pids}")
        if self.created_root_link:
            done = ip("link", "del", self.root_link)
            if done.returncode != 0 and "Cannot find device" not in done.stderr:
                problems.append(f"ip link del {self.root_link}: {done.stderr.strip()}")
        for name in reversed(self.created_namespaces):
            done = ip("netns", "del", name)
            if done.returncode != 0:
                problems.append(f"ip netns del {name}: {done.stderr.strip()}")
        left = {line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line}
        problems += [f"namespace {n} is left" for n in self.created_namespaces if n in left]
        if self.created_root_link and ip("link", "show", "dev", self.root_link).returncode == 0:
            problems.append(f"link {self.root_link} is left in the root namespace")
        return problems


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    if IP is None:
        pytest.skip("no `ip` command (iproute2) on PATH: cannot build network namespaces")
    if os.geteuid() != 0:
        pytest.skip(f"needs root to create network namespaces (running as uid {os.geteuid()})")
    n = Net(suffix=secrets.token_hex(3), subnet=ipaddress.ip_network("10.231.0.0/24"))
    try:
        try:
            n.subnet = unused_subnet()
            n.build()
        except NetworkUnavailable as exc:
            pytest.skip(f"cannot build the test network: {exc}")
        yield n
    finally:
        problems = n.teardown()
        assert not problems, "cleanup left something behind: " + "; ".join(problems)


class NsService(ServiceProcess):
    """A service in a namespace, bound to 0.0.0.0 and reached at that namespace's address."""

    def __init__(
        self, net: Net, role: str, app: str, port: int, log_path: Path, **kwargs: object
    ) -> None:
        super().__init__(
            app, port, log_path, host="0.0.0.0", wrapper=net.exec_prefix(role), **kwargs
        )
        self.address = net.addresses[role]

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


@dataclass
class Services:
    started: list[NsService] = field(default_factory=list)

    def start(self, *services: NsService) -> None:
        for s in services:
            self.started.append(s)
            s.start()
        for s in services:
            s.wait_healthy(START_TIMEOUT_S)
            # stop() signals this pid: it must be uvicorn itself, not a wrapper around it.
            cmdline = Path(f"/proc/{s.proc.pid}/cmdline").read_bytes()
            assert b"uvicorn" in cmdline, cmdline

    def stop_all(self) -> None:
        errors = []
        for s in reversed(self.started):  # workers before the master
            try:
                s.stop()
            except Exception as exc:  # go on: every other process must still be ended
                errors.append(f"{s.app} pid {s.proc.pid}: {exc!r}")
        still = [f"{s.app} pid {s.proc.pid}" for s in self.started if s.running()]
        assert not errors and not still, f"could not end: {errors + still}"


@pytest.fixture
def services() -> Iterator[Services]:
    s = Services()
    try:
        yield s
    finally:
        s.stop_all()


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
