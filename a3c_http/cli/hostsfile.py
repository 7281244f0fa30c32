"""The hosts file of `a3c-hosts` (docs/guide/several-hosts.md): one host a line,

    [user@]host[:sshport]  [PORTS]  [option=value ...]     # a comment

- `host` is what `ssh` connects to: a name (one of your ssh config's too) or an IP address,
  an IPv6 one in brackets (`[fd00::11]:2222`); `user` and `sshport` default to ssh's own.
- PORTS are the ports of the workers to run there: `8001`, `8001,8002`, `8001-8004`; without
  them, one worker on 8001 (or `workers=N`: N workers from 8001 on).
- options: `workers=N`; `address=ADDR`, the address the master reaches the host's workers at
  (default: `host`); `bind=ADDR`, the one they bind (default: `address` where it is an IP
  address, else 0.0.0.0); `cert=FILE` and `key=FILE`, this host's own certificate and key
  (relative to the hosts file's folder; default: A3C_TLS_CERT and A3C_TLS_KEY); `bin=DIR`, the
  folder that holds `a3c-worker` on this host (default: `a3c-hosts up --bin`).

Blank lines and `#` comments are ignored. A line that is not one of these is a HostsFileError
that names the file and the line, and why.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

FIRST_PORT = 8001  # a3c-worker's own default port: where `workers=N` starts
MAX_WORKERS = 256  # a line asking for more is a typo (8001-9001), not a plan
OPTIONS = ("workers", "address", "bind", "cert", "key", "bin")
_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*\Z")
_NAME = re.compile(r"(?!-)[A-Za-z0-9._-]+\Z")  # never a leading '-': ssh would read an option


class HostsFileError(ValueError):
    """The hosts file cannot be read or holds a line that is not a host; one line of text."""


@dataclass(frozen=True)
class Host:
    """One line of the hosts file: where to ssh, and the workers to run there."""

    line: int
    host: str  # as ssh takes it (an IPv6 address without its brackets)
    user: str | None
    ssh_port: int | None
    ports: tuple[int, ...]
    address: str  # the address the master (and a3c-hosts) reach its workers at
    bind: str  # what its workers bind (a3c-worker --host)
    cert: Path | None = None  # its own certificate and key, else the shared ones
    key: Path | None = None
    bin: str | None = None  # the folder of a3c-worker there, else --bin, else PATH

    @property
    def name(self) -> str:
        """The host as its line wrote it (`[user@]host[:sshport]`): how the output names it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        target = f"{self.user}@{host}" if self.user else host
        return f"{target}:{self.ssh_port}" if self.ssh_port else target

    @property
    def folder(self) -> str:
        """Its own folder under the remote folder: two hosts that share a home directory (NFS)
        keep apart."""
        return f"{self.host}_{self.ssh_port}" if self.ssh_port else self.host

    def where(self, port: int) -> str:
        """`address:port` of its worker on `port`."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{port}"

    def url(self, port: int, scheme: str) -> str:
        return f"{scheme}://{self.where(port)}"


def read_hosts_file(path: Path) -> list[Host]:
    """The hosts of the file at `path`, in its order; HostsFileError for anything else."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not text"
        raise HostsFileError(f"cannot read the hosts file {path} ({why})") from None
    return parse_hosts(text.splitlines(), str(path), path.parent)


def parse_hosts(lines: list[str], source: str, base: Path) -> list[Host]:
    """The hosts of `lines` (`source` names them in errors; `base` is the folder that relative
    cert= and key= paths start from). No host at all, two lines for one host, or one worker
    address twice is a HostsFileError too."""
    hosts: list[Host] = []
    folders: dict[str, int] = {}
    workers: dict[tuple[str, int], int] = {}
    for number, raw in enumerate(lines, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            host = parse_line(text, number, base)
        except HostsFileError as exc:
            raise HostsFileError(f"{source} line {number}: {exc}") from None
        if host.folder in folders:
            raise HostsFileError(
                f"{source} line {number}: {host.name} is already on line {folders[host.folder]}"
                " (list all its ports on one line)"
            )
        folders[host.folder] = number
        for port in host.ports:
            where = (host.address, port)
            if where in workers:
                raise HostsFileError(
                    f"{source} line {number}: a worker at {host.where(port)} is already "
                    f"on line {workers[where]}"
                )
            workers[where] = number
        hosts.append(host)
    if not hosts:
        raise HostsFileError(f"{source} lists no host (one `[user@]host[:sshport] [PORTS]` a line)")
    return hosts


def parse_line(text: str, number: int, base: Path) -> Host:
    """One line without its comment (`number` is recorded in the Host)."""
    target, *rest = text.split()
    user, host, ssh_port = parse_target(target)
    ports: tuple[int, ...] | None = None
    options: dict[str, str] = {}
    for field in rest:
        if "=" not in field:
            if ports is not None or options:
                raise HostsFileError(
                    f"{field!r}: expected option=value ({', '.join(OPTIONS)}) after the ports"
                )
            ports = parse_ports(field)
            continue
        name, _, value = field.partition("=")
        if name not in OPTIONS:
            raise HostsFileError(f"unknown option {name!r} (the options: {', '.join(OPTIONS)})")
        if name in options:
            raise HostsFileError(f"{name}= is given twice")
        if not value:
            raise HostsFileError(f"{name}= needs a value")
        options[name] = value
    if "workers" in options:
        if ports is not None:
            raise HostsFileError("give the ports or workers=N, not both")
        count = _number(options["workers"], "workers=", 1, MAX_WORKERS)
        ports = tuple(range(FIRST_PORT, FIRST_PORT + count))
    address = options.get("address", host)
    if not _is_address(address):
        raise HostsFileError(f"address={address!r}: not a host name or an IP address")
    bind = options.get("bind") or (address if _is_ip(address) else "0.0.0.0")
    if not _is_ip(bind):
        raise HostsFileError(f"bind={bind!r}: not an IP address (0.0.0.0 binds them all)")
    if ("cert" in options) != ("key" in options):
        raise HostsFileError("cert= and key= go together: give both or neither")
    cert, key = (_file(base, options[n], n) if n in options else None for n in ("cert", "key"))
    return Host(
        line=number, host=host, user=user, ssh_port=ssh_port, ports=ports or (FIRST_PORT,),
        address=address, bind=bind, cert=cert, key=key, bin=options.get("bin"),
    )  # fmt: skip


def parse_target(target: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:sshport]` -> (user, host, sshport); an IPv6 host in brackets."""
    user, at, rest = target.rpartition("@")
    if at and not _USER.match(user):
        raise HostsFileError(f"{target!r}: {user!r} is not a user name")
    port_text = None
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        if not bracket or not _is_ip(host) or ":" not in host:
            raise HostsFileError(f"{target!r}: expected an IPv6 address in brackets, [fd00::11]")
        if tail:
            if not tail.startswith(":"):
                raise HostsFileError(f"{target!r}: expected [address]:sshport")
            port_text = tail[1:]
    elif rest.count(":") > 1:
        raise HostsFileError(f"{target!r}: write an IPv6 address in brackets, [{rest}]")
    else:
        host, colon, port_text = rest.partition(":")
        port_text = port_text if colon else None
        if not _is_address(host):
            raise HostsFileError(
                f"{target!r}: expected [user@]host[:sshport], e.g. ubuntu@10.0.0.11:22"
            )
    ssh_port = _number(port_text, f"{target!r}: the ssh port", 1, 65535) if port_text else None
    return (user or None), host, ssh_port


def parse_ports(text: str) -> tuple[int, ...]:
    """`8001`, `8001,8002`, `8001-8004` (and mixes of them), each port once."""
    ports: list[int] = []
    for item in text.split(","):
        first, dash, last = item.partition("-")
        low = _number(first, f"port {item!r}", 1, 65535)
        high = _number(last, f"port range {item!r}", low, 65535) if dash else low
        for port in range(low, high + 1):
            if port in ports:
                raise HostsFileError(f"port {port} is listed twice in {text!r}")
            ports.append(port)
    if len(ports) > MAX_WORKERS:
        raise HostsFileError(f"{text!r} is {len(ports)} workers (at most {MAX_WORKERS} a host)")
    return tuple(ports)


def _number(text: str, what: str, low: int, high: int) -> int:
    if not text.isdigit() or not low <= int(text) <= high:
        raise HostsFileError(f"{what}: {text!r} is not a number from {low} to {high}")
    return int(text)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_address(text: str) -> bool:
    return _is_ip(text) or bool(_NAME.match(text))


def _file(base: Path, text: str, option: str) -> Path:
    path = (base / Path(text).expanduser()).resolve()
    if not path.is_file():
        raise HostsFileError(f"{option}={text}: no such file ({path})")
    return path
