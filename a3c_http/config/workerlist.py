"""The list of a run's workers: workers.txt (A3C_WORKERS_FILE), or the `workers` of POST /train,
one `host:port` or `http(s)://host:port` an entry (https where none is given and TLS is
configured, where http:// is refused: a3c_http/net/tls.py); blank lines and `#` comments are
ignored. The
master reads it to start a run's workers, and `a3c-train` to know which of them to start on this
host."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from a3c_http.net import tls


class WorkerListError(ValueError):
    """workers.txt, or the `workers` of POST /train, holds something that is not a worker URL."""


class PlainUnderTLS(WorkerListError):
    """A worker's URL is http:// while TLS is configured."""


def normalize_url(entry: str, default_port: bool = False, scheme: str = "http") -> str:
    """`host:port` or `http(s)://host:port` -> `http(s)://host:port`, `scheme` where it has none.
    With `default_port`, a URL without a port gets its scheme's (80 or 443)."""
    text = entry.strip()
    if "://" not in text:
        text = f"{scheme}://{text}"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise WorkerListError(f"{entry!r}: the scheme must be http or https")
    try:
        port = parts.port
    except ValueError:
        raise WorkerListError(f"{entry!r}: the port is not a number from 1 to 65535") from None
    if port is None and default_port:
        port = 443 if parts.scheme == "https" else 80
    if not parts.hostname or port is None:
        raise WorkerListError(f"{entry!r}: expected host:port, e.g. 127.0.0.1:8001")
    if parts.path not in ("", "/") or parts.query:
        raise WorkerListError(f"{entry!r}: expected only a scheme, a host and a port")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def parse_workers(
    entries: list[str], source: str, allow_none: bool = False, served: tls.TLS | None = None
) -> list[str]:
    """The worker URLs of `entries` (lines, `#` comments); with `allow_none`, an empty list for
    none (a run for workers that join), else a WorkerListError. With TLS configured in `served`
    (default: this process's, `tls.current()`), https where no scheme is given and http:// a
    PlainUnderTLS."""
    urls: list[str] = []
    served = served or tls.current()
    for number, raw in enumerate(entries, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            served.require_https(line, "a worker")
        except tls.TLSError as exc:
            raise PlainUnderTLS(f"{source} entry {number}: {exc}") from None
        try:
            url = normalize_url(line, scheme=served.scheme)
        except WorkerListError as exc:
            raise WorkerListError(f"{source} entry {number}: {exc}") from None
        if url in urls:
            raise WorkerListError(f"{source} entry {number}: {url} is listed twice")
        urls.append(url)
    if not urls and not allow_none:
        raise WorkerListError(f"{source} lists no worker")
    return urls


def read_workers_file(
    path: Path, missing_ok: bool = False, served: tls.TLS | None = None
) -> list[str]:
    """The worker URLs of a workers file; with `missing_ok`, none when the file does not exist
    or lists none (the master's default file: the run waits for workers that join)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        if missing_ok:
            return []
        raise WorkerListError(
            f"cannot read the workers file {path} (no such file); set A3C_WORKERS_FILE or "
            'pass "workers": ["host:port", ...] in the body'
        ) from None
    except OSError as exc:
        raise WorkerListError(
            f"cannot read the workers file {path} ({exc.strerror}); set A3C_WORKERS_FILE or "
            'pass "workers": ["host:port", ...] in the body'
        ) from None
    return parse_workers(text.splitlines(), str(path), allow_none=missing_ok, served=served)
