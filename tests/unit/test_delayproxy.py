"""DelayProxy (a3c_http/testing/delayproxy.py), the far-away master of the benchmarks: through it to
an echo server on loopback, every byte arrives intact and in order, a round trip takes at least the
delay both ways, the counters count what went through, and close() ends its thread."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from a3c_http.testing.delayproxy import DelayProxy

DELAY_S = 0.05


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    # One connection at a time, served on the server's own thread: the proxy's are the only new.
    server = socketserver.TCPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _receive(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


def test_bytes_arrive_intact_in_order_and_a_round_trip_takes_the_delay_both_ways(
    echo_port: int,
) -> None:
    before = set(threading.enumerate())
    proxy = DelayProxy(echo_port, DELAY_S).start()
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"ping")
            assert _receive(sock, 4) == b"ping"
            assert time.monotonic() - started >= 2 * DELAY_S
            # Several writes of distinct bytes, larger than one chunk: one stream, in order.
            payload = b"".join(i.to_bytes(4, "big") for i in range(100_000))
            for k in range(0, len(payload), 70_000):
                sock.sendall(payload[k : k + 70_000])
            assert _receive(sock, len(payload)) == payload
        total = 4 + len(payload)
        assert proxy.bytes_up == proxy.bytes_down == total
        assert proxy.connections == 1
    finally:
        proxy.close()
    assert set(threading.enumerate()) <= before


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="delay_s"):
        DelayProxy(1, -0.001)
