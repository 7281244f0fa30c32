"""Reading workers.txt and starting the workers of a run over HTTP."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from a3c_http.config import TrainConfig
from a3c_http.outbound import IDENTITY, BoundedTransport, ReplyRefused
from master.ledger import RunLedger

# A worker answers POST /start_worker with a few hundred bytes of JSON: a larger reply is not one.
START_REPLY_BYTES = 1024 * 1024


class WorkerListError(ValueError):
    """workers.txt, or the `workers` of POST /train, holds something that is not a worker URL."""


def normalize_url(entry: str, default_port: bool = False) -> str:
    """`host:port` or `http(s)://host:port` -> `http(s)://host:port`. With `default_port`, a URL
    without a port gets its scheme's (80 or 443)."""
    text = entry.strip()
    if "://" not in text:
        text = "http://" + text
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


def parse_workers(entries: list[str], source: str, allow_none: bool = False) -> list[str]:
    """The worker URLs of `entries` (lines, `#` comments); with `allow_none`, an empty list for
    none (a run for workers that join), else a WorkerListError."""
    urls: list[str] = []
    for number, raw in enumerate(entries, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            url = normalize_url(line)
        except WorkerListError as exc:
            raise WorkerListError(f"{source} entry {number}: {exc}") from None
        if url in urls:
            raise WorkerListError(f"{source} entry {number}: {url} is listed twice")
        urls.append(url)
    if not urls and not allow_none:
        raise WorkerListError(f"{source} lists no worker")
    return urls


def read_workers_file(path: Path, missing_ok: bool = False) -> list[str]:
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
    return parse_workers(text.splitlines(), str(path), allow_none=missing_ok)


def _start_one(client: httpx.Client, url: str, body: dict[str, Any]) -> str | None:
    """POST /start_worker; None when it started, else why not."""
    try:
        response = client.post(f"{url}/start_worker", json=body)
    except httpx.HTTPError as exc:
        return f"cannot reach the worker: {type(exc).__name__}: {exc}"
    except ReplyRefused as exc:
        return f"the worker's reply {exc}"
    if response.status_code == 202:
        return None
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    if response.status_code == 401:
        return f"the worker refused the token (401): set the same A3C_TOKEN everywhere ({detail})"
    return f"the worker answered {response.status_code}: {str(detail)[:500]}"


def start_workers(
    ledger: RunLedger,
    workers: dict[str, str],
    run_id: str,
    config: TrainConfig,
    master_url: str,
    token: str | None,
    timeout_s: float = 10.0,
    proxy_from_env: bool = False,
    push_url: str | None = None,
) -> list[dict[str, Any]]:
    """POST /start_worker to every worker (id -> URL) at once; a worker that cannot be started is
    marked failed with the reason. Each call ends within `timeout_s`, however slowly the worker
    answers, and goes through the proxy the environment names only with `proxy_from_env`
    (A3C_PROXY_FROM_ENV). `push_url`: where the workers send their gradients, when the master has
    fronts (master/fronts.py)."""
    jobs = [
        (
            worker_id,
            url,
            {
                "master_url": master_url,
                "worker_id": worker_id,
                "run_id": run_id,
                "config": config.model_dump(),
                "exploration": ledger.exploration_of(worker_id),
                **({"push_url": push_url} if push_url else {}),
            },
        )
        for worker_id, url in workers.items()
    ]
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    client = httpx.Client(
        headers={**auth, **IDENTITY},
        timeout=timeout_s,
        transport=BoundedTransport(START_REPLY_BYTES, proxy_from_env=proxy_from_env),
        trust_env=False,  # the proxy, if any, is the transport's choice
    )
    with client, ThreadPoolExecutor(max_workers=min(16, len(jobs))) as pool:
        errors = list(pool.map(lambda job: _start_one(client, job[1], job[2]), jobs))
    results = []
    for (worker_id, url, _), error in zip(jobs, errors, strict=True):
        if error:
            ledger.mark_failed(worker_id, error)
        else:
            ledger.worker_accepted(worker_id)
        results.append(
            {"url": url, "worker_id": worker_id, "started": error is None, "error": error}
        )
    return results
