"""A peer that answers HTTP badly on purpose, for the bounds of our outbound calls
(a3c_http/net/outbound.py): a raw server on a loopback port, in threads of the test's process.

Every request gets `200 OK` and then a body of the `body` kind:

- `trickle`: `length` bytes announced in Content-Length, one sent every `interval_s`: a master
  that answers, but never within a deadline;
- `huge`: `length` bytes as fast as the client takes them, chunked (or announced in
  Content-Length with `announce`): a master that sends more than the client may read;
- `json`: `{}` at once, with `extra_headers` (lines of `Name: value\r\n`): a listener that
  records what reached it (as a proxy would), or a master whose reply's headers are wrong.

`heads` keeps the head of every request (request line and headers); `sent` counts the body bytes
handed to the kernel (at most a socket buffer more than the client read); `connections` counts
those the client opened and `open` those still open. `without_proxies` clears the environment
variables that name proxies, for a test to set its own.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Literal, Self

import pytest

_CHUNK = 65536
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def without_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


class BadPeer:
    def __init__(
        self,
        body: Literal["trickle", "huge", "json"],
        length: int = 64,
        interval_s: float = 0.3,
        announce: bool = False,
        extra_headers: bytes = b"",
    ) -> None:
        self.body, self.length, self.interval_s, self.announce = body, length, interval_s, announce
        self.extra_headers = extra_headers
        self.heads: list[bytes] = []
        self.sent = 0
        self.connections = 0
        self.open = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection (the client's read fails at once) and end the threads."""
        self._closing.set()
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            with contextlib.suppress(OSError):  # not connected, or closed by the client already
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(10)

    def _spawn(self, target, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="bad-peer")
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._sockets.append(conn)
                self.connections += 1
                self.open += 1
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        try:
            while self._answer(conn):
                pass
        except OSError:
            pass  # the client closed the connection: what it ends with
        finally:
            with self._lock:
                self.open -= 1
            conn.close()

    def _answer(self, conn: socket.socket) -> bool:
        """Read one request and answer it; False once the client has closed the connection."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(_CHUNK)
            if not chunk:
                return False
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        with self._lock:
            self.heads.append(head)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            chunk = conn.recv(_CHUNK)
            if not chunk:
                return False
            rest += chunk
        if self.body == "json":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         + self.extra_headers + b"Content-Length: 2\r\n\r\n{}")
        elif self.body == "trickle":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.length)
            for _ in range(self.length):
                if self._closing.wait(self.interval_s):
                    return False
                self._count(conn.send(b"x"))
        else:
            framing = (b"Content-Length: %d" % self.length if self.announce
                       else b"Transfer-Encoding: chunked")
            conn.sendall(b"HTTP/1.1 200 OK\r\n" + framing + b"\r\n\r\n")
            block, left = b"\0" * _CHUNK, self.length
            while left > 0 and not self._closing.is_set():
                piece = block[: min(left, _CHUNK)]
                conn.sendall(piece if self.announce else b"%x\r\n%s\r\n" % (len(piece), piece))
                self._count(len(piece))
                left -= len(piece)
            if not self.announce:
                conn.sendall(b"0\r\n\r\n")
        return True

    def _count(self, sent: int) -> None:
        with self._lock:
            self.sent += sent
