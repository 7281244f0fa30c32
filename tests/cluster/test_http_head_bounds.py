"""The bounds on a request's head (a3c_http/server/headbounds.py, hooked in by a3c_http/tuning/),
on a real `uvicorn worker.app:app` with each HTTP implementation uvicorn can pick (httptools, its
default with uvicorn[standard], and h11): only the process shows them, since uvicorn reads the head
before any app sees it.

A head over A3C_MAX_HEADER_BYTES (the default 64 KiB) gets 431 and is dropped as it comes, not
gathered in memory; a connection that does not complete its head within A3C_HEADER_TIMEOUT_S
(1 s here) is closed, on connecting or on a kept-alive connection."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from a3c_http.local.cluster import ServiceProcess, free_port, wait_for

pytestmark = pytest.mark.integration

LIMIT = 64 * 1024
HUGE = 64 * 1024 * 1024  # the header that cost the master 60 MB before


@pytest.fixture(scope="module", params=["httptools", "h11"])
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[ServiceProcess]:
    log = tmp_path_factory.mktemp("head-bounds") / f"worker-{request.param}.log"
    proc = ServiceProcess("worker.app:app", free_port(), Path(log),
                          env={"A3C_HEADER_TIMEOUT_S": "1", "A3C_TOKEN": ""},
                          uvicorn_args=["--http", request.param])
    try:
        yield proc.start().wait_healthy(120)
    finally:
        proc.stop()
        assert not proc.running()


def rss(pid: int) -> int:
    """The process's resident memory, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def connect(service: ServiceProcess) -> socket.socket:
    return socket.create_connection((service.host, service.port), timeout=10)


def closed(s: socket.socket) -> bool:
    """Whether the service has closed `s` (without waiting)."""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(65536) == b""
    except ConnectionResetError:
        return True


def test_a_head_over_the_limit_is_431_and_not_kept_in_memory(service: ServiceProcess) -> None:
    # Under the limit, a long header is served: the bound is not "no long headers".
    reply = httpx.get(f"{service.url}/status", headers={"X-Pad": "a" * (LIMIT - 2048)},
                      timeout=10, trust_env=False)
    assert reply.status_code == 200, reply.text
    before = rss(service.pid)
    answer, sent = b"", 0
    with connect(service) as s:
        s.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        chunk = b"a" * 65536
        try:
            while sent < HUGE:
                s.sendall(chunk)
                sent += len(chunk)
                if select.select([s], [], [], 0)[0]:  # the answer came: read it while we can
                    answer += s.recv(65536)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the service closed the connection once the answer was out
        s.settimeout(10)
        try:
            while data := s.recv(65536):
                answer += data
        except ConnectionResetError:
            pass
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert b"connection: close" in head.lower()
    assert "A3C_MAX_HEADER_BYTES" in json.loads(body)["detail"]
    grown = rss(service.pid) - before
    print(f"{service.uvicorn_args}: sent {sent / 2**20:.0f} MiB, the process grew {grown} bytes")
    assert sent >= 16 * 1024 * 1024, "the service stopped reading: the memory check means little"
    assert grown < 8 * 1024 * 1024, f"the process grew by {grown} bytes"
    assert service.healthy()


def test_a_head_not_complete_in_time_closes_the_connection(service: ServiceProcess) -> None:
    started = time.monotonic()
    silent = connect(service)
    partial = connect(service)
    partial.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    kept = connect(service)  # a kept-alive connection: one request, then half of the next
    kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    while not answer.endswith(b'"ok"}'):  # the socket's timeout bounds the wait
        answer += kept.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 ")
    kept.sendall(b"GET /status HTTP/1.1\r\n")
    try:
        assert not any(closed(s) for s in (silent, partial, kept)), "closed before the timeout"
        # Within uvicorn's own keep-alive timeout (5 s), which a started request turns off.
        wait_for(lambda: all(closed(s) for s in (silent, partial, kept)), 4, "the closes")
        assert time.monotonic() - started >= 0.9  # the timeout, not at once
    finally:
        for s in (silent, partial, kept):
            s.close()
    assert service.healthy()
