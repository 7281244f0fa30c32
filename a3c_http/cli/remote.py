"""`a3c-train --master URL`: a run on a master that is already running, started and followed
from here (`on_master`), or only followed (`--follow`: `attach_on_master`). a3c_http/cli/train.py
reads the command line; a3c_http/cli/progress.py follows the run.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import httpx

from a3c_http.cli.progress import (
    RECONNECT_S,
    MasterLost,
    Stopped,
    follow,
    read_status,
    start_run,
)
from a3c_http.config.workerlist import WorkerListError, normalize_url
from a3c_http.net import tls


def on_master(
    url: str,
    body: dict[str, Any] | None,
    time_cap: float | None,
    every: float,
    transport: httpx.BaseTransport | None = None,
    reconnect_s: float = RECONNECT_S,
) -> int:
    """A run of `body` on the running master at `url` (None: the run it runs now), followed until
    it finishes (`transport`: how to reach it, if not over the network)."""
    try:
        served = tls.current()
        served.require_https(url, "--master")
    except tls.TLSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        url = normalize_url(url, default_port=True) if "://" in url else ""
    except WorkerListError:
        url = ""
    if not url:
        print("error: --master: expected a URL such as http://10.0.0.10:33333", file=sys.stderr)
        return 2
    token = os.environ.get("A3C_TOKEN") or None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    verify = served.client_context()  # A3C_TLS_CA, and this host's certificate under mutual TLS
    with httpx.Client(
        headers=headers, timeout=30, trust_env=False, transport=transport, verify=verify
    ) as http:
        if body is None:
            return attach_on_master(http, url, every, reconnect_s)
        return follow_on_master(http, url, body, time_cap, every, reconnect_s)


def follow_on_master(
    http: httpx.Client,
    url: str,
    body: dict[str, Any],
    time_cap: float | None,
    every: float,
    reconnect_s: float = RECONNECT_S,
) -> int:
    """Start a run of `body` on the master at `url` through `http` and follow it: the exit code.
    A run already running there is left alone (exit 2); the run this started is stopped when
    this is interrupted."""
    data = None
    status: dict[str, Any] = {}
    try:
        data = start_run(http, url, body, replace_running=False)
        if data is None:
            return 2
        status = follow(http, url, data["run_id"], time_cap, every, reconnect_s)
    except Stopped as exc:
        print(f"\n{exc}: stopping the run" if data else f"\n{exc}")
    except (httpx.HTTPError, MasterLost) as exc:
        print(f"error: {url}: {exc}", file=sys.stderr)
    finally:
        if data is not None and not status:
            with contextlib.suppress(httpx.HTTPError):
                http.post(f"{url}/stop", json={}, timeout=10)
    if data is None:
        return 2
    solved = bool(status.get("solved"))
    print("SOLVED" if solved else "not solved")
    return 0 if solved else 1


def attach_on_master(
    http: httpx.Client, url: str, every: float, reconnect_s: float = RECONNECT_S
) -> int:
    """Follow the run the master at `url` runs now (`--follow`): the exit code, as for a run
    this started (2: no run there); its last run's ending when it ended already. The run is
    left running when this is interrupted."""
    try:
        now = read_status(http, url)
    except httpx.HTTPError as exc:
        print(f"error: cannot reach the master at {url}: {exc}", file=sys.stderr)
        return 2
    if not now.get("run_id"):
        print(f"error: the master at {url} has no run to follow: start one", file=sys.stderr)
        return 2
    status: dict[str, Any] = {}
    print(f"following run {now['run_id']} on {url} ({now['state']})")
    try:
        status = follow(http, url, now["run_id"], None, every, reconnect_s)
    except Stopped as exc:
        print(f"\n{exc}: run {now['run_id']} goes on; a3c-train --master {url} --follow")
        return 1
    except (httpx.HTTPError, MasterLost) as exc:
        print(f"error: {url}: {exc}", file=sys.stderr)
    solved = bool(status.get("solved"))
    print("SOLVED" if solved else "not solved")
    return 0 if solved else 1
