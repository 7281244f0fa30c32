"""What `a3c-hosts up` carries to each host (a3c_http/cli/hostsremote.py says where it goes): the
token, the environment packages, the TLS files and the workers' variables, read and checked here
before any host is touched (`plan`), then packed for each host as one gzipped tar (`Carry`).
"""

from __future__ import annotations

import io
import os
import re
import shlex
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from a3c_http.cli.hostsfile import Host
from a3c_http.net import tls

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class CarryError(ValueError):
    """Something `up` was asked to carry cannot be carried, or TLS is set for some hosts and not
    for others; one line of text (exit status 2)."""


@dataclass
class Carry:
    """What `up` carries: the files every host gets, and the certificate a host without one of
    its own gets."""

    shared: list[tuple[str, bytes, int]]
    cert: tuple[bytes, bytes] | None  # A3C_TLS_CERT and A3C_TLS_KEY here

    def for_host(self, host: Host) -> bytes:
        """The host's bundle: the shared files and its certificate (its own, else the shared)."""
        pair = self.cert
        if host.cert is not None and host.key is not None:
            pair = (host.cert.read_bytes(), host.key.read_bytes())
        own = [("tls/host.crt", pair[0], 0o600), ("tls/host.key", pair[1], 0o600)] if pair else []
        return bundle(self.shared + own)


def plan(
    hosts: list[Host],
    served: tls.TLS,
    packages: list[Path],
    env_modules: str = "",
    master_url: str | None = None,
    env: tuple[str, ...] | list[str] = (),
) -> tuple[Carry, str]:
    """What `up` carries to `hosts` given this process's TLS settings (`served`), the environment
    `packages`, more modules for A3C_ENV_MODULES, A3C_MASTER_URL and more `env` (NAME=VALUE)
    for the workers; with one line that says what it is."""
    files: list[tuple[str, bytes, int]] = [("token", token().encode(), 0o600)]
    modules = os.environ.get("A3C_ENV_MODULES", "").split(",") + env_modules.split(",")
    for path in packages:
        names, package = package_files(path)
        modules += names
        files += [(name, data, 0o644) for name, data in package]
    variables: dict[str, str] = {}
    if modules := list(dict.fromkeys(m.strip() for m in modules if m.strip())):
        variables["A3C_ENV_MODULES"] = ",".join(modules)
    if master_url:
        served.require_https(master_url, "--master-url")
        variables["A3C_MASTER_URL"] = master_url
    if served.mutual:
        variables["A3C_TLS_MUTUAL"] = "true"
    for item in env:
        name, equals, value = item.partition("=")
        if not equals:
            raise CarryError(f"--env {item}: expected NAME=VALUE")
        variables[name] = value
    files.append(("worker.env", env_file(variables), 0o600))
    if served.ca is not None:
        files.append(("tls/ca.crt", served.ca.read_bytes(), 0o644))
    cert = None
    if served.cert is not None and served.key is not None:
        cert = (served.cert.read_bytes(), served.key.read_bytes())
    said = ["the token"] + [f"{p} (on PYTHONPATH)" for p in packages]
    if served.configured:
        own = sum(1 for h in hosts if h.cert)
        said.append(f"the TLS files ({own} of {len(hosts)} hosts with a certificate of its own)")
    workers = sum(len(h.ports) for h in hosts)
    # The values of our own variables; only the names of the others (a secret, perhaps).
    shown = "".join(
        f", {k}={v}" if k.startswith("A3C_") else f", {k}" for k, v in variables.items()
    )
    line = (f"a3c-hosts up: {_count(workers, 'worker')} on {_count(len(hosts), 'host')}; "
            f"carrying {', '.join(said)}; setting A3C_TOKEN_FILE{shown}")  # fmt: skip
    return Carry(files, cert), line


def check_tls(hosts: list[Host], served: tls.TLS, source: Path) -> None:
    """TLS for all hosts or for none: with A3C_TLS_* set here, every host gets a certificate (its
    own or A3C_TLS_CERT); a certificate of a host's own needs them set (the master's CA, and how
    a3c-hosts checks the worker), and must match its key."""
    for host in hosts:
        where = f"{source} line {host.line}"
        if served.configured and host.cert is None and served.cert is None:
            raise CarryError(
                f"{where}: TLS is configured here ({', '.join(served.set_variables())}) but "
                f"{host.name} gets no certificate: give cert= and key= on its line, or set "
                "A3C_TLS_CERT and A3C_TLS_KEY (a certificate that names every host)"
            )
        if host.cert is None:
            continue
        if not served.configured:
            raise CarryError(
                f"{where}: cert= without TLS here: set A3C_TLS_CA (the CA that signed the "
                "hosts' certificates), as for the master"
            )
        try:
            tls.TLS(cert=host.cert, key=host.key, ca=served.ca).check()
        except tls.TLSError as exc:
            raise CarryError(f"{where}: {exc}".replace("A3C_TLS_CERT", "cert")
                             .replace("A3C_TLS_KEY", "key")) from None  # fmt: skip


def token() -> str:
    """The token of this process's A3C_TOKEN or A3C_TOKEN_FILE, which the workers must share."""
    value = os.environ.get("A3C_TOKEN", "").strip()
    path = os.environ.get("A3C_TOKEN_FILE", "").strip()
    if not value and path:
        try:
            value = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError):
            raise CarryError(f"A3C_TOKEN_FILE={path!r}: cannot read it") from None
    if not value:
        raise CarryError(
            "up needs the master's token: set A3C_TOKEN (or A3C_TOKEN_FILE); workers on other "
            "hosts serve nobody without one"
        )
    return value


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def package_files(path: Path) -> tuple[list[str], list[tuple[str, bytes]]]:
    """The modules an environment package makes importable and its files under `env/`: a package
    folder (with its __init__.py), a single module (`name.py`) or a pure-Python wheel (`.whl`,
    unpacked as pip would put its files in site-packages)."""
    if not path.exists():
        raise CarryError(f"--env-package {path}: no such file or folder")
    if path.is_dir():
        if not (path / "__init__.py").is_file():
            inside = sorted(p.parent.name for p in path.glob("*/__init__.py"))
            hint = f" (the package in it: {path / inside[0]}?)" if inside else ""
            raise CarryError(
                f"--env-package {path}: not a package folder (no __init__.py){hint}; name the "
                "folder whose import registers the environment, a module.py or a wheel"
            )
        files = [
            (f"env/{path.name}/{p.relative_to(path).as_posix()}", p.read_bytes())
            for p in sorted(path.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ]
        return [_module(path.name, path)], files
    if path.suffix == ".py":
        return [_module(path.stem, path)], [(f"env/{path.name}", path.read_bytes())]
    if path.suffix == ".whl":
        return _wheel(path)
    raise CarryError(f"--env-package {path}: expected a package folder, a module.py or a .whl")


def _wheel(path: Path) -> tuple[list[str], list[tuple[str, bytes]]]:
    try:
        with zipfile.ZipFile(path) as wheel:
            members = [(i.filename, wheel.read(i)) for i in wheel.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, OSError) as exc:
        raise CarryError(f"--env-package {path}: not a wheel ({exc})") from None
    files, modules = [], set()
    for name, data in members:
        if name.startswith("/") or ".." in name.split("/"):
            raise CarryError(f"--env-package {path}: {name!r} would land outside its folder")
        top, _, rest = name.partition("/")
        if top.endswith(".data"):  # where pip puts them: purelib and platlib in site-packages
            kind, _, rest = rest.partition("/")
            if kind not in ("purelib", "platlib"):
                continue
            name, top = rest, rest.partition("/")[0]
        if top != name and not top.endswith(".dist-info"):
            modules.add(top)  # a package
        elif top == name and name.endswith(".py"):
            modules.add(name.removesuffix(".py"))  # a single module
        files.append((f"env/{name}", data))
    if not modules:
        raise CarryError(f"--env-package {path}: the wheel holds no module")
    return [_module(m, path) for m in sorted(modules)], files


def _module(name: str, path: Path) -> str:
    if not name.isidentifier():
        raise CarryError(f"--env-package {path}: {name!r} is not a module name Python imports")
    return name


def env_file(variables: dict[str, str]) -> bytes:
    """worker.env: `NAME='value'` lines for `sh`'s `.`."""
    for name in variables:
        if not _ENV_NAME.match(name):
            raise CarryError(f"--env {name}=...: not a variable name")
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(variables.items())).encode()


def bundle(files: list[tuple[str, bytes, int]]) -> bytes:
    """A gzipped tar of (path, content, mode) entries, the folders they need made 0700."""
    out = io.BytesIO()
    now = time.time()
    folders = sorted({str(a) for p, _, _ in files for a in Path(p).parents} - {"."})
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, now
            tar.addfile(info)
        for path, data, mode in files:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), mode, now
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
