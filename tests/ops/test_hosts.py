"""`a3c-hosts` against real sshd daemons: one in each worker namespace of tests/support/netns.py
(w1 on port 2222, w2 on 22), with a host key, a client key, a known_hosts and an ssh config that
this test makes; a master in the namespace `m`; a3c-hosts itself in this process, in the root
namespace, as an operator's machine.

One pass over TLS: `up` carries an environment package and the TLS files (w1 its own
certificate, w2 the shared one), the master trains a short run on the environment of that
package with the workers of the workers file `up` wrote; `status` reports both workers and, in
one line, a host where nothing answers; `down` stops them and nothing of theirs is left. Skipped
with the reason where namespaces, sshd, ssh or cryptography are missing.

The sh scripts a3c-hosts runs on a host, run here by `sh` (no ssh, no namespaces), with a
stand-in a3c-worker: a worker that exits at start is reported with its log's last line, one
running is left as it is, one that ignores SIGTERM is killed after the grace, and a pid file that
names another process never gets it signalled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from a3c_http.cli import certs, hosts
from a3c_http.cli.hostscarry import bundle
from a3c_http.cli.hostsremote import DOWN, STATUS, UP
from a3c_http.local.cluster import wait_for
from a3c_http.net import tls
from tests.support.common import SHORT_RUN
from tests.support.netns import IP, START_TIMEOUT_S, Net, NsService, Services
from tests.support.netns import net as net
from tests.support.netns import services as services

pytestmark = pytest.mark.integration

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
SSH_PORTS = {"w1": 2222, "w2": 22}
PROBE_ENV = '''import gymnasium as gym

if "HostsProbe-v0" not in gym.registry:
    gym.register("HostsProbe-v0", max_episode_steps=100,
                 entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv")
'''


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, whose parent has not reaped it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def end(pid: int) -> None:
    """SIGTERM, and SIGKILL 15 s later: a worker a failed test left behind."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # the polling interval of a deadline-bound wait
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class SshHosts:
    config: Path  # ssh -F: the client key, known_hosts, user root
    remote: Path  # a3c-hosts --remote-dir (every namespace shares this file system)
    sshd: dict[str, subprocess.Popen]

    def worker_pids(self) -> dict[Path, int]:
        """The pid files `up` left, and their pids."""
        found = {}
        for path in self.remote.glob("*/*.pid"):
            with contextlib.suppress(ValueError, OSError):
                found[path] = int(path.read_text())
        return found


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
                   capture_output=True, timeout=30)  # fmt: skip
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture
def ssh_hosts(net: Net, tmp_path: Path) -> Iterator[SshHosts]:
    missing = [n for n, v in (("sshd", SSHD), ("ssh", shutil.which("ssh")),
                              ("ssh-keygen", shutil.which("ssh-keygen"))) if not v]  # fmt: skip
    if missing:
        pytest.skip(f"no {', '.join(missing)} here (Debian: openssh-server, openssh-client)")
    try:  # sshd's privilege separation folder, which its service unit would make
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    except OSError as exc:
        pytest.skip(f"cannot make /run/sshd for sshd: {exc}")
    keys = tmp_path / "ssh"
    keys.mkdir(mode=0o700)
    (keys / "authorized_keys").write_text(_keygen(keys / "client") + "\n")
    host_key = _keygen(keys / "host").rsplit(" ", 1)[0]  # without its comment
    known, started = [], {}
    hosts = SshHosts(keys / "config", tmp_path / "remote", started)
    try:
        for role, port in SSH_PORTS.items():
            address = net.addresses[role]
            config = keys / f"sshd_{role}"
            config.write_text(
                f"ListenAddress {address}:{port}\nHostKey {keys / 'host'}\nPidFile none\n"
                f"AuthorizedKeysFile {keys / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel ERROR\n"
            )
            log = (keys / f"sshd_{role}.log").open("wb")
            started[role] = subprocess.Popen(
                [*net.exec_prefix(role), SSHD, "-D", "-e", "-f", str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            log.close()
            known.append(f"{address if port == 22 else f'[{address}]:{port}'} {host_key}")
        (keys / "known_hosts").write_text("\n".join(known) + "\n")
        hosts.config.write_text(
            f"Host *\n  User root\n  IdentityFile {keys / 'client'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {keys / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
        )
        for role, port in SSH_PORTS.items():
            wait_for(lambda r=role, p=port: _listening(hosts, keys, r, net.addresses[r], p),
                     30, f"sshd in {role}")  # fmt: skip
        yield hosts
    finally:
        for pid in hosts.worker_pids().values():  # what `down` did not stop (a failed test)
            cmdline = Path(f"/proc/{pid}/cmdline")
            if alive(pid) and b"a3c-worker" in cmdline.read_bytes():
                end(pid)
        for proc in started.values():
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


def _listening(hosts: SshHosts, keys: Path, role: str, address: str, port: int) -> bool:
    proc = hosts.sshd[role]
    if proc.poll() is not None:
        pytest.skip(f"sshd in {role} exited: {(keys / f'sshd_{role}.log').read_text()[-500:]}")
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
        return True
    return False


FAKE_WORKER = """#!{python}
# A stand-in for a3c-worker: on 8002 it exits at once, saying why; on 8003 it ignores SIGTERM.
import signal, sys, time
port = sys.argv[sys.argv.index("--port") + 1]
if port == "8002":
    sys.exit("a3c-worker: 127.0.0.1:8002 is in use")
if port == "8003":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open("8003.ignores-sigterm", "w").close()  # in the folder `up` started it in
while True:
    time.sleep(0.05)
"""


def test_the_scripts_report_exits_leave_the_running_and_signal_only_their_workers(
    tmp_path: Path,
) -> None:
    """The sh scripts `up`, `status` and `down` run on a host, run here by `sh` (no ssh)."""
    bin_dir, folder = tmp_path / "bin", tmp_path / "remote" / "host"
    bin_dir.mkdir()
    worker = bin_dir / "a3c-worker"
    worker.write_text(FAKE_WORKER.format(python=sys.executable))
    worker.chmod(0o755)
    files = bundle([("token", b"t", 0o600), ("worker.env", b"", 0o600)])

    def script(text: str, *args: str, stdin: bytes = b"") -> dict[int, list[str]]:
        done = subprocess.run(["sh", "-c", text, "a3c-hosts", str(folder), *args], input=stdin,
                              capture_output=True, timeout=30)  # fmt: skip
        assert done.returncode == 0, done
        return {int(w[1]): [w[0], *w[2:]] for w in
                (line.split(" ", 3) for line in done.stdout.decode().splitlines())}  # fmt: skip

    started = script(UP, "127.0.0.1", str(bin_dir), "8001", "8002", "8003", stdin=files)
    pids = {port: int(said[1]) for port, said in started.items()}
    assert {port: said[0] for port, said in started.items()} == dict.fromkeys(pids, "started")
    try:
        dead = wait_for(lambda: (s := script(STATUS, "8001", "8002", "8003"))[8002][0] == "dead"
                        and s, 30, "the worker on 8002 to exit")  # fmt: skip
        assert dead[8002] == ["dead", str(pids[8002]), "a3c-worker: 127.0.0.1:8002 is in use"]
        assert dead[8001] == ["running", str(pids[8001])]
        again = script(UP, "127.0.0.1", str(bin_dir), "8001", stdin=files)
        assert again == {8001: ["running", str(pids[8001])]}  # left as it is

        # The worker on 8003 ignores SIGTERM from here on (a signal before it did would end it).
        wait_for(lambda: (folder / "8003.ignores-sigterm").exists(), 30, "8003 to ignore SIGTERM")
        # A pid file that names another process (its pid given to someone else since).
        stranger = subprocess.Popen(["sleep", "60"])
        (folder / "8009.pid").write_text(f"{stranger.pid}\n")
        try:
            stopped = script(DOWN, "1", "8001", "8002", "8003", "8009", "8010")
            assert stranger.poll() is None, "down signalled a process that is not its worker"
        finally:
            stranger.kill()
            stranger.wait(timeout=15)
        assert stopped == {
            8001: ["stopped", str(pids[8001])], 8002: ["gone", str(pids[8002])],
            8003: ["killed", str(pids[8003])], 8009: ["gone", str(stranger.pid)],
            8010: ["none"],
        }  # fmt: skip
        assert not any(alive(p) for p in pids.values()) and not list(folder.glob("*.pid"))
    finally:
        for pid in pids.values():
            if alive(pid) and b"a3c-worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                end(pid)


def run_hosts(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = hosts.main(list(argv))
    out, err = capsys.readouterr()
    assert not err, err
    return code, out.splitlines()


def test_up_status_down_on_two_ssh_hosts_that_a_master_trains_with(
    net: Net, ssh_hosts: SshHosts, services: Services, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    pytest.importorskip("cryptography", reason="the test's certificates need the tls extra")
    m, w1, w2 = (net.addresses[r] for r in ("m", "w1", "w2"))
    folders = {"w1": ssh_hosts.remote / f"{w1}_2222", "w2": ssh_hosts.remote / w2}  # one a host
    ca_dir = tmp_path / "certs"
    certs.make_ca(ca_dir)
    master_cert = certs.make_host(ca_dir, "master", [m])
    own = certs.make_host(ca_dir, "w1", [w1])  # w1's own; the shared one names w2 only
    shared = certs.make_host(ca_dir, "workers", [w2])
    package = tmp_path / "envs" / "hostsprobe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PROBE_ENV)
    token = "hosts-test-token-0123456789"
    for name in ("A3C_TOKEN_FILE", "A3C_ENV_MODULES", "A3C_MASTER_URL", "A3C_TLS_MUTUAL"):
        monkeypatch.delenv(name, raising=False)
    master_env = {"A3C_TLS_CERT": str(master_cert.cert), "A3C_TLS_KEY": str(master_cert.key)}
    for name, value in (("A3C_TOKEN", token), ("A3C_TLS_CA", str(ca_dir / "ca.crt")),
                        ("A3C_TLS_CERT", str(shared.cert)), ("A3C_TLS_KEY", str(shared.key))):
        monkeypatch.setenv(name, value)  # fmt: skip

    workers_file = tmp_path / "workers.txt"
    master = NsService(
        net, "m", "master.app:app", 33333, tmp_path / "master.log", token=token,
        env={**master_env, "A3C_RUN_DIR": str(tmp_path / "run"), "PYTHONPATH": str(package.parent),
             "A3C_WORKERS_FILE": str(workers_file), "A3C_ENV_MODULES": "hostsprobe"},
    )  # fmt: skip
    services.started.append(master)
    master.start()  # its start overlaps the workers'

    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(
        f"# the test's two hosts\nroot@{w1}:{SSH_PORTS['w1']}  8001  cert={own.cert} "
        f"key={own.key}\n{w2}\n"
    )
    common = ["--ssh-config", str(ssh_hosts.config), "--remote-dir", str(ssh_hosts.remote)]
    code, out = run_hosts(capsys, "up", str(hosts_file), *common, "--env-package", str(package),
                          "--bin", str(Path(sys.executable).parent),
                          "--workers-file", str(workers_file))  # fmt: skip
    assert code == 0, out
    assert out[0].startswith("a3c-hosts up: 2 workers on 2 hosts; carrying the token, ")
    assert "A3C_ENV_MODULES=hostsprobe" in out[0]
    pids = {r: int((folder / "8001.pid").read_text()) for r, folder in folders.items()}
    assert f"root@{w1}:2222 8001: started, pid {pids['w1']}, healthy at https://{w1}:8001" in out
    assert f"{w2} 8001: started, pid {pids['w2']}, healthy at https://{w2}:8001" in out
    assert workers_file.read_text().splitlines()[1:] == [f"https://{w1}:8001", f"https://{w2}:8001"]

    # What arrived, and what the workers were started with.
    for role, cert in (("w1", own.cert), ("w2", shared.cert)):
        folder = folders[role]
        assert (folder / "tls" / "host.crt").read_bytes() == cert.read_bytes()
        assert (folder / "tls" / "ca.crt").read_bytes() == (ca_dir / "ca.crt").read_bytes()
        assert (folder / "env" / "hostsprobe" / "__init__.py").read_text() == PROBE_ENV
        assert (folder / "token").stat().st_mode & 0o077 == 0
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{pids[role]}/environ").read_bytes().decode().split("\0")
            if "=" in item
        )
        assert environ["A3C_ENV_MODULES"] == "hostsprobe"
        assert environ["PYTHONPATH"].split(":")[0] == str(folder / "env")
        assert environ["A3C_TLS_CERT"] == str(folder / "tls" / "host.crt")
        assert environ["A3C_TOKEN_FILE"] == str(folder / "token") and "A3C_TOKEN" not in environ

    # The master trains a short run over TLS with the workers of the file `up` wrote.
    master.wait_healthy(START_TIMEOUT_S)
    verify = tls.from_environ({**master_env, "A3C_TLS_CA": str(ca_dir / "ca.crt")}).client_context()
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30, verify=verify,
                      trust_env=False) as http:  # fmt: skip
        body = {**SHORT_RUN, "env_id": "hostsprobe:HostsProbe-v0", "master_url": master.url}
        reply = http.post(f"{master.url}/train", json=body)
        assert reply.status_code == 202, reply.text
        final = wait_for(lambda: (s := http.get(f"{master.url}/status").json())["state"]
                         == "finished" and s, 120, "the run to finish")  # fmt: skip
        # Without the token, from another host (this test's namespace): 401, Bearer.
        with httpx.Client(timeout=30, verify=verify, trust_env=False) as anonymous:
            for url in (f"{master.url}/status", f"https://{w1}:8001/status"):
                r = anonymous.get(url)
                assert r.status_code == 401 and r.headers.get("WWW-Authenticate") == "Bearer", r
            assert anonymous.post(f"{master.url}/train", json=SHORT_RUN).status_code == 401
        # Once the workers are done, what they counted is what the master credited them with.
        final = wait_for(lambda: (s := http.get(f"{master.url}/status").json())
                         and {w["state"] for w in s["workers"]} == {"done"} and s, 30,
                         "the master to see both workers done")  # fmt: skip
        seen = {u: http.get(f"{u}/status").json() for u in (f"https://{w1}:8001",
                                                              f"https://{w2}:8001")}  # fmt: skip
    assert final["finish_reason"].startswith("max_episodes"), final
    records = {w["url"]: w for w in final["workers"]}
    assert sorted(records) == [f"https://{w1}:8001", f"https://{w2}:8001"], final["workers"]
    assert all(r["episodes"] > 0 for r in records.values()), records
    assert sum(r["episodes"] for r in records.values()) == final["global_episode"] >= 40
    assert sum(r["steps"] for r in records.values()) == final["global_steps"]
    for url, worker in seen.items():
        assert worker["state"] == "done" and worker["master_url"] == master.url, worker
        assert worker["episodes"] == records[url]["episodes"], (worker, records[url])

    # status: both running and healthy; a host where nothing answers is one line, not a hang.
    nobody = str(net.subnet.network_address + 13)
    with_nobody = tmp_path / "with_nobody.txt"
    with_nobody.write_text(hosts_file.read_text() + f"{nobody}   # no such host\n")
    started = time.monotonic()
    code, out = run_hosts(capsys, "status", str(with_nobody), *common, "--connect-timeout", "1")
    assert code == 1 and time.monotonic() - started < 10, out
    said = [line for line in out if nobody in line]
    assert len(said) == 1 and said[0].startswith(f"{nobody}: cannot reach it over ssh (ssh: "), out
    assert said[0].endswith("check its address and ssh port, and that sshd runs there"), said
    assert set(out) - set(said) == {
        f"root@{w1}:2222 8001: running, pid {pids['w1']}, healthy at https://{w1}:8001",
        f"{w2} 8001: running, pid {pids['w2']}, healthy at https://{w2}:8001",
    }, out

    # down: both stopped by their pids; nothing of theirs is left in the hosts' namespaces.
    code, out = run_hosts(capsys, "down", str(hosts_file), *common)
    assert code == 0, out
    assert sorted(out) == sorted([f"root@{w1}:2222 8001: stopped (pid {pids['w1']})",
                                  f"{w2} 8001: stopped (pid {pids['w2']})"])  # fmt: skip
    assert not ssh_hosts.worker_pids() and not any(alive(p) for p in pids.values())

    def only_sshd_left() -> bool:
        return all(
            set(map(int, subprocess.run([IP, "netns", "pids", net.namespaces[r]], text=True,
                capture_output=True, timeout=30).stdout.split())) <= {ssh_hosts.sshd[r].pid}
            for r in SSH_PORTS
        )  # fmt: skip

    wait_for(only_sshd_left, 15, "only sshd left in the hosts' namespaces")
