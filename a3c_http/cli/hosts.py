"""`a3c-hosts`: the workers of a hosts file started, checked and stopped over ssh
(docs/guide/several-hosts.md).

    a3c-hosts up HOSTS [--env-package PATH]... [--env-modules M,...] [--master-url URL]
                       [--env NAME=VALUE]... [--bin DIR] [--workers-file FILE] [--wait-s 60]
    a3c-hosts status HOSTS
    a3c-hosts down HOSTS [--grace-s 15]
    and each: [--remote-dir .a3c-hosts] [--ssh-config FILE] [--ssh-option KEY=VALUE]...
              [--connect-timeout 10] [--parallel 16]

HOSTS is the hosts file (a3c_http/cli/hostsfile.py). `up` carries to each host the token
(A3C_TOKEN or A3C_TOKEN_FILE here), the environment packages, the TLS files of this process's
A3C_TLS_* (a host's own certificate where its line names one), sets A3C_ENV_MODULES,
A3C_MASTER_URL and A3C_TLS_MUTUAL for its workers, starts them and waits until each answers
/healthz; `status` says of each worker whether it runs (its pid file) and answers /healthz;
`down` stops what `up` started, by the pids it recorded. The hosts are driven in parallel (at
most --parallel at once) with the system `ssh` (a3c_http/cli/hostsremote.py), which never asks
for anything: a host it cannot reach is one line, after --connect-timeout at the latest.

/healthz is asked from here, as the master would ask it: https with this process's A3C_TLS_CA
(and its certificate, under mutual TLS).

Exit status: 0 when every host did what was asked (every worker up, running or stopped); 1 when
some did not (one line each, naming the host, the worker, and what to do); 2 for a mistake in
the command line, the hosts file or what `up` was told to carry (one line; nothing was done).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from a3c_http.cli.hostscarry import Carry, CarryError, check_tls, plan
from a3c_http.cli.hostsfile import Host, HostsFileError, read_hosts_file
from a3c_http.cli.hostsremote import DOWN, REMOTE_DIR, STATUS, UP, Reply, Ssh
from a3c_http.net import tls

WAIT_S = 60.0  # a worker imports torch: tens of seconds on a slow host's first start
GRACE_S = 15  # as the services' own graceful shutdown in the local harness
SCRIPT_S = 30.0  # what a script may take beyond the connection (up: unpacking the files)
PROBE_S = 2.0  # one /healthz
CHECK_EVERY_S = 3.0  # while `up` waits, how often it asks a host whether a worker died


class UsageError(ValueError):
    """A mistake in what the command was given; exit status 2."""


@dataclass
class Outcome:
    """One host's part: whether it did what was asked, its lines, the URLs of its workers up."""

    ok: bool
    lines: list[str]
    up: list[str] = field(default_factory=list)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="a3c-hosts",
        description="Start, check and stop the workers of a hosts file over ssh "
        "(one `[user@]host[:sshport] [PORTS] [option=value ...]` a line).",
    )
    commands = p.add_subparsers(dest="command", required=True, metavar="{up,status,down}")
    up = commands.add_parser("up", help="carry the files, start the workers, wait until healthy")
    status = commands.add_parser("status", help="whether each worker runs and answers /healthz")
    down = commands.add_parser("down", help="stop the workers `up` started, by their pids")
    for sub in (up, status, down):
        sub.add_argument("hosts", type=Path, help="the hosts file")
        sub.add_argument("--remote-dir", default=REMOTE_DIR, metavar="DIR",
                         help=f"the folder on each host, under which each host has its own "
                         f"(default {REMOTE_DIR}, in the ssh user's home)")  # fmt: skip
        sub.add_argument("--ssh-config", type=Path, metavar="FILE", help="ssh -F FILE")
        sub.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE",
                         help="ssh -o KEY=VALUE (repeatable)")  # fmt: skip
        sub.add_argument(
            "--connect-timeout",
            type=float,
            default=10.0,
            metavar="S",
            help="give up on a host that does not answer ssh within S seconds (10)",
        )
        sub.add_argument("--parallel", type=int, default=16, metavar="N",
                         help="hosts driven at once (16)")  # fmt: skip
    up.add_argument(
        "--env-package",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="a package folder, module.py or pure-Python wheel whose import registers "
        "your environment: put on the workers' PYTHONPATH and in A3C_ENV_MODULES",
    )
    up.add_argument("--env-modules", default="", metavar="M,...",
                    help="more modules for A3C_ENV_MODULES (with this process's A3C_ENV_MODULES "
                    "and the packages')")  # fmt: skip
    up.add_argument("--master-url", default=os.environ.get("A3C_MASTER_URL"), metavar="URL",
                    help="A3C_MASTER_URL for the workers: they join that master by themselves "
                    "(default: this process's A3C_MASTER_URL)")  # fmt: skip
    up.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="another variable for the workers (repeatable)")  # fmt: skip
    up.add_argument("--bin", default="", metavar="DIR",
                    help="the folder of a3c-worker on the hosts, e.g. ~/a3c/.venv/bin (default: "
                    "the ssh session's PATH; bin= on a line for that host)")  # fmt: skip
    up.add_argument(
        "--workers-file",
        type=Path,
        metavar="FILE",
        help="write the URLs of the workers that came up, the master's workers file",
    )
    up.add_argument("--wait-s", type=float, default=WAIT_S, metavar="S",
                    help=f"how long a worker has to answer /healthz ({WAIT_S:g})")  # fmt: skip
    down.add_argument(
        "--grace-s",
        type=int,
        default=GRACE_S,
        metavar="S",
        help=f"how long a worker has to end after SIGTERM before SIGKILL ({GRACE_S})",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        hosts = read_hosts_file(args.hosts)
        served = tls.current()
        check_tls(hosts, served, args.hosts)
        if args.parallel < 1 or args.connect_timeout <= 0:
            raise UsageError("--parallel and --connect-timeout must be positive")
        if shutil.which("ssh") is None:
            raise UsageError("no `ssh` on PATH: install the OpenSSH client")
        ssh = Ssh(args.connect_timeout, args.ssh_config, tuple(args.ssh_option))
        cluster = Cluster(ssh, args.remote_dir.rstrip("/") or ".", served)
        if args.command == "up":
            carry, said = plan(hosts, served, args.env_package, args.env_modules,
                               args.master_url, args.env)  # fmt: skip
            print(said, flush=True)
            work: Callable[[Host], Outcome] = lambda h: cluster.up(h, carry, args)  # noqa: E731
        elif args.command == "status":
            work = cluster.status
        else:
            work = lambda h: cluster.down(h, args.grace_s)  # noqa: E731
    except (HostsFileError, CarryError, tls.TLSError, UsageError) as exc:
        print(f"a3c-hosts: {exc}", file=sys.stderr)
        return 2
    outcomes = drive(hosts, work, args.parallel)
    if args.command == "up" and args.workers_file is not None:
        write_workers_file(args.workers_file, [o for h in hosts for o in outcomes[h.line].up])
    return 0 if all(o.ok for o in outcomes.values()) else 1


def drive(hosts: list[Host], work: Callable[[Host], Outcome], parallel: int) -> dict[int, Outcome]:
    """`work` on every host, at most `parallel` at once, each host's lines printed together as
    it finishes; the outcomes by line number."""
    printing = threading.Lock()
    outcomes: dict[int, Outcome] = {}
    with ThreadPoolExecutor(max_workers=min(parallel, len(hosts))) as pool:
        futures = {pool.submit(work, host): host for host in hosts}
        for future in as_completed(futures):
            host = futures[future]
            try:
                outcome = future.result()
            except Exception as exc:  # a bug must not hide what the other hosts did
                outcome = Outcome(False, [f"{host.name}: a3c-hosts failed: {exc!r}"])
            outcomes[host.line] = outcome
            with printing:
                print("\n".join(outcome.lines), flush=True)
    return outcomes


class Cluster:
    """The three commands on one host each, over `ssh`, with its folder under `remote_dir`."""

    def __init__(self, ssh: Ssh, remote_dir: str, served: tls.TLS) -> None:
        self.ssh, self.remote_dir, self.served = ssh, remote_dir, served

    def folder(self, host: Host) -> str:
        return f"{self.remote_dir}/{host.folder}"

    def url(self, host: Host, port: int) -> str:
        return host.url(port, self.served.scheme)

    def up(self, host: Host, carry: Carry, args: argparse.Namespace) -> Outcome:
        ports = [str(p) for p in host.ports]
        call = [self.folder(host), host.bind, host.bin or args.bin, *ports]
        reply = self.ssh.run(host, UP, call, carry.for_host(host), SCRIPT_S)
        if failed := self._failed(host, reply):
            return failed
        lines, up = [], []
        pending = {p: (s, pid) for p, (s, pid, _) in _answers(reply, host.ports).items()}
        deadline, next_check = time.monotonic() + args.wait_s, time.monotonic() + CHECK_EVERY_S
        why: dict[int, str] = {}
        while pending:
            for port, (state, pid) in list(pending.items()):
                if (problem := self.probe(host, port)) is None:
                    was = "already running" if state == "running" else "started"
                    lines.append(f"{host.name} {port}: {was}, pid {pid}, healthy at "
                                 f"{self.url(host, port)}")  # fmt: skip
                    up.append(self.url(host, port))
                    del pending[port]
                else:
                    why[port] = problem
            if pending and time.monotonic() >= next_check:
                for port, (state, pid, rest) in self._ask(host, list(pending)).items():
                    if state != "running":
                        lines.append(self._not_running(host, port, state, pid, rest))
                        del pending[port]
                next_check = time.monotonic() + CHECK_EVERY_S
            if pending and time.monotonic() >= deadline:
                for port, (_, pid) in pending.items():
                    lines.append(
                        f"{host.name} {port}: running (pid {pid}) but {self.url(host, port)}"
                        f"/healthz did not answer within {args.wait_s:g} s ({why[port]}): check "
                        f"that this host reaches it (a firewall; address= and bind= on line "
                        f"{host.line}), and its log {self.folder(host)}/{port}.log there"
                    )
                break
            if pending:
                time.sleep(0.2)  # the polling interval of a deadline-bound wait
        up.sort(key=lambda url: int(url.rpartition(":")[2]))
        return Outcome(len(up) == len(host.ports), sorted(lines, key=_port_of), up)

    def status(self, host: Host) -> Outcome:
        reply = self.ssh.run(host, STATUS, [self.folder(host), *map(str, host.ports)], None,
                             SCRIPT_S)  # fmt: skip
        if failed := self._failed(host, reply):
            return failed
        lines, ok = [], True
        for port, (state, pid, rest) in _answers(reply, host.ports).items():
            if state != "running":
                lines.append(self._not_running(host, port, state, pid, rest))
                ok = False
            elif (problem := self.probe(host, port)) is None:
                lines.append(f"{host.name} {port}: running, pid {pid}, healthy at "
                             f"{self.url(host, port)}")  # fmt: skip
            else:
                lines.append(f"{host.name} {port}: running, pid {pid}, but "
                             f"{self.url(host, port)}/healthz: {problem}")  # fmt: skip
                ok = False
        return Outcome(ok, lines)

    def down(self, host: Host, grace_s: int) -> Outcome:
        call = [self.folder(host), str(grace_s), *map(str, host.ports)]
        reply = self.ssh.run(host, DOWN, call, None, SCRIPT_S + grace_s)
        if failed := self._failed(host, reply):
            return failed
        said = {
            "none": "not running (nothing to stop)",
            "gone": "had already exited (pid {pid}); nothing to stop",
            "stopped": "stopped (pid {pid})",
            "killed": f"killed (pid {{pid}} and its group): it had not ended {grace_s} s after "
            "SIGTERM",
        }
        lines, ok = [], True
        for port, (state, pid, _) in _answers(reply, host.ports).items():
            if state in said:
                lines.append(f"{host.name} {port}: {said[state].format(pid=pid)}")
            else:
                lines.append(f"{host.name} {port}: no answer from the host about it ({state})")
                ok = False
        return Outcome(ok, lines)

    def probe(self, host: Host, port: int) -> str | None:
        """None when the worker answers /healthz with 200, else why not."""
        try:
            reply = httpx.get(f"{self.url(host, port)}/healthz", timeout=PROBE_S,
                              verify=self.served.client_context(), trust_env=False)  # fmt: skip
        except httpx.HTTPError as exc:
            return str(exc) or type(exc).__name__
        return None if reply.status_code == 200 else f"answered {reply.status_code}"

    def _ask(self, host: Host, ports: list[int]) -> dict[int, tuple[str, str, str]]:
        reply = self.ssh.run(host, STATUS, [self.folder(host), *map(str, ports)], None, SCRIPT_S)
        return {} if reply.code != 0 else _answers(reply, ports)

    def _not_running(self, host: Host, port: int, state: str, pid: str, rest: str) -> str:
        if state == "none":
            return f"{host.name} {port}: not running (`a3c-hosts up` starts it)"
        log = f"{self.folder(host)}/{port}.log"
        last = f"; its log's last line: {rest}" if rest else ""
        return f"{host.name} {port}: not running, exited (pid {pid}){last} (the log: {log} there)"

    def _failed(self, host: Host, reply: Reply) -> Outcome | None:
        if problem := self.ssh.failure(host, reply, SCRIPT_S):
            return Outcome(False, [f"{host.name}: {problem}"])
        said = [line.split(" ", 1) for line in reply.out.splitlines() if line.startswith("error ")]
        if said:
            what = said[0][1].strip()
            if what.startswith("no-worker "):
                what = (f"no {what[10:]} there: give --bin DIR (or bin=DIR on line {host.line}), "
                        "the folder of a3c-worker on that host, e.g. ~/a3c/.venv/bin")  # fmt: skip
            return Outcome(False, [f"{host.name}: {what}"])
        if reply.code != 0:
            last = (reply.err.strip().splitlines() or ["no message"])[-1]
            return Outcome(False, [f"{host.name}: the script there failed (exit {reply.code}): "
                                   f"{last}"])  # fmt: skip
        return None


def _answers(reply: Reply, ports: list[int] | tuple[int, ...]) -> dict[int, tuple[str, str, str]]:
    """`state PORT [PID [REST]]` lines -> {port: (state, pid, rest)}, every port of `ports`
    (`unanswered` for one the script did not name)."""
    out = {port: ("unanswered", "?", "") for port in ports}
    for line in reply.out.splitlines():
        words = line.split(" ", 3) + ["", "", ""]
        if words[1].isdigit() and int(words[1]) in out:
            out[int(words[1])] = (words[0], words[2] or "?", words[3].strip())
    return out


def _port_of(line: str) -> int:
    word = line.split(" ", 2)[1] if line.count(" ") >= 2 else ""
    return int(word.rstrip(":")) if word.rstrip(":").isdigit() else 0


def write_workers_file(path: Path, urls: list[str]) -> None:
    """The master's workers file: the workers that came up, one URL a line."""
    if not urls:
        print(f"a3c-hosts: did not write {path}: no worker came up", file=sys.stderr)
        return
    path.write_text("# written by a3c-hosts up: the workers that answered /healthz\n"
                    + "".join(f"{u}\n" for u in urls))  # fmt: skip
    print(f"wrote {path} ({len(urls)} worker{'s' * (len(urls) != 1)}): "
          f"A3C_WORKERS_FILE={path} for the master", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
