"""Network-namespace "hosts" for the tests that need several machines (tests/ops/test_netns.py,
tests/ops/test_hosts.py): a master and two worker hosts, each its own Linux network namespace with
its own address, as README's "On several hosts" runs them.

The network, built once per test module with `ip` (unique names and subnet per run):

    root namespace (this test process, 10.231.N.1) --veth-- +
    a3c-<sfx>-m   master    10.231.N.10           --veth-- + bridge br0 in its own
    a3c-<sfx>-w1  worker 1  10.231.N.11           --veth-- + namespace a3c-<sfx>-br
    a3c-<sfx>-w2  worker 2  10.231.N.12           --veth-- +

The test process reaches the services through its own veth into the bridge, so every request it
sends comes from another host's address (10.231.N.1), never from loopback: that is what the auth
checks need. N is picked at random among the 10.231.N.0/24 that nothing in the root namespace
uses (10.231.N.13 is left unused: a host that is not there). Each namespace has `lo` up. Services
bind 0.0.0.0 as in the README and are started with `ip netns exec <ns> python -m uvicorn ...`
(which execs, so the pid we hold is uvicorn's).

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from a3c_http.local.cluster import ServiceProcess

IP = shutil.which("ip")
# Generous: other test runs may share the 2 cores.
START_TIMEOUT_S = 90


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
        return f"{'https' if self.tls.serves else 'http'}://{self.address}:{self.port}"


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
