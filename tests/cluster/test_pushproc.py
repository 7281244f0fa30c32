"""The push process (a3c_http/net/push_process.py): gradient pushes sent by a child of the caller,
against a small HTTP server on loopback that plays the master. Replies, errors and retries come back
as MasterClient's own results; a stop ends the retries and a reply that trickles in, the size bound
holds in the child too; a child that dies fails what is pending."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from a3c_http.local.cluster import free_port, wait_for
from a3c_http.net.client import Conflict, MasterClient, MasterUnavailable, ProtocolError, Stopped
from a3c_http.wire import tensors as wire
from tests.support.badpeer import BadPeer
from tests.support.client import LAYOUT, SPEC, TENSORS

# Every test starts the push process, a real child process.
pytestmark = pytest.mark.integration

PUSH = {"log_level": "warning", "log_format": "text", "worker_id": "w1"}
Reply = tuple[int, dict[str, str], bytes]


def weights(version: int) -> Reply:
    return 200, {wire.VERSION_HEADER: str(version)}, wire.encode(TENSORS)


class Master(ThreadingHTTPServer):
    """Answers each POST with the next of `replies` (the last one repeats) and keeps what came."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[tuple[str, dict[str, str], bytes]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.requests.append((self.path, dict(self.headers), body))
                status, headers, content = server.replies[
                    min(len(server.requests), len(server.replies)) - 1
                ]
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(content))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, *args: object) -> None:
                pass

        server = self
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def master() -> Iterator[Master]:
    server = Master(weights(5))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def client_of(url: str, **kwargs) -> MasterClient:
    options = {"backoff_s": 0.01, "max_backoff_s": 0.02, "retry_deadline_s": 30.0} | kwargs
    return MasterClient(url, push_threads=2, push_process=PUSH, **options)


def push(client: MasterClient, version: int = 4):
    grads = {name: torch.full_like(t, 0.5) for name, t in TENSORS.items()}
    return client.push_gradients_async("w1", version, grads, LAYOUT, loss=1.5)


def test_a_push_goes_from_the_child_and_its_reply_comes_back(master: Master) -> None:
    with client_of(master.url, token="t0k", run_id="r9") as client:
        pending = push(client)
        reply = pending.result(timeout=30)
        child = client._pusher.proc
        assert child.pid != os.getpid() and child.poll() is None
        # The caller's thread took the reply in: the worker has no thread that wakes for it.
        assert not [t for t in threading.enumerate() if t.name.startswith("a3c-push")]
        # Timed by the child, from the hand-over to the reply.
        assert 0 < pending.round_trip_s < time.monotonic() - pending.sent_at
    assert reply.version == 5 and torch.equal(reply.tensors["w"], TENSORS["w"])
    # What the client built (tests/unit/test_client_messages.py) arrives as it was, with the token
    # the child's own transport adds.
    ((path, headers, body),) = master.requests
    assert path == "/gradients" and headers["Authorization"] == "Bearer t0k"
    assert headers["X-Worker-Id"] == "w1" and headers["X-Run-Id"] == "r9"
    assert torch.equal(wire.decode(body, SPEC)["b"], torch.full((2,), 0.5))
    assert child.poll() is not None  # closing the client ended the child


def test_the_child_retries_5xx_and_a_4xx_is_the_callers_error(master: Master) -> None:
    conflict = (409, {"X-A3C-Stop": "1", "Content-Type": "application/json"}, b'{"detail": "x"}')
    master.replies = [(503, {}, b"busy"), (503, {}, b"busy"), weights(6), conflict]
    with client_of(master.url) as client:
        assert push(client).result(timeout=30).version == 6
        assert client.retries == 2
        with pytest.raises(Conflict) as info:
            push(client).result(timeout=30)
    assert info.value.stop and info.value.status_code == 409


def test_a_stop_ends_the_retries_of_a_master_that_is_away() -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with client_of(nobody, backoff_s=0.05, max_backoff_s=5.0, retry_deadline_s=600.0) as client:
        pending = push(client)
        # Its retries are counted as they happen, not only once the push is over.
        wait_for(lambda: client.retries >= 2, 30, "the child to retry")
        client.transport.stop_event.set()  # the worker is told to stop: no 600 s of retries
        with pytest.raises(Stopped, match="told to stop"):
            pending.result(timeout=30)


def test_a_stop_ends_a_push_whose_reply_trickles_in() -> None:
    with BadPeer("trickle", interval_s=0.3) as master, client_of(
        master.url, timeout_s=30.0
    ) as client:
        pending = push(client)
        wait_for(lambda: master.sent >= 1, 30, "the reply to begin trickling", interval_s=0.01)
        started = time.monotonic()
        client.transport.stop_event.set()
        with pytest.raises(Stopped, match="waiting for the reply: POST /gradients"):
            pending.result(timeout=30)
        elapsed = time.monotonic() - started
    assert elapsed < 1.0, elapsed  # the wait's poll of the stop and the child's read slice


def test_the_child_reads_no_reply_past_the_workers_size_bound() -> None:
    with BadPeer("huge", length=64 << 20) as master:
        client = client_of(master.url, max_reply_bytes=4096)
        with client, pytest.raises(ProtocolError, match="passed A3C_MAX_BODY_BYTES=4096 bytes"):
            push(client).result(timeout=30)
    assert len(master.heads) == 1 and master.sent < 16 << 20, master.sent


def test_a_child_that_dies_fails_its_pushes_instead_of_leaving_them_waiting() -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with client_of(nobody, backoff_s=5.0, max_backoff_s=5.0, retry_deadline_s=600.0) as client:
        pending = push(client)
        os.kill(client._pusher.proc.pid, signal.SIGKILL)
        with pytest.raises(MasterUnavailable, match="push process ended"):
            pending.result(timeout=30)
        with pytest.raises(MasterUnavailable, match="push process ended"):
            push(client).result(timeout=30)
