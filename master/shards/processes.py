"""The processes of a run's shards as the master sees them (master/shards/coordinator.py): one it
forked from its fork server (`ForkedShard`), or one started elsewhere (`RemoteShard`,
A3C_SHARDS_URLS); and its connection to one for its decisions (`ShardChannel`)."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any
from urllib.parse import urlsplit

import httpx

from a3c_http.config.settings import Settings
from master.learning.learner_needs import child_context
from master.shards.server import serve


class ForkedShard:
    """One shard's process, forked from the master's fork server (master/learning/learner_needs.py
    `child_context`) on a socket the master bound, ending when the master's end of its pipe
    closes (the master ended, or was killed)."""

    def __init__(self, index: int, host: str, port: int, scheme: str, control: str) -> None:
        self.index, self.host, self.scheme = index, host, scheme
        listening = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listening.bind((host, port + index if port else 0))
        except OSError as exc:
            listening.close()
            raise RuntimeError(
                f"shard {index} cannot listen on {host}:{port + index if port else 0} "
                f"({exc.strerror}): see A3C_SHARDS_HOST and A3C_SHARDS_PORT"
            ) from None
        listening.listen(1024)
        self.port = listening.getsockname()[1]
        context = child_context()
        theirs, self._pipe = context.Pipe(duplex=False)
        self.proc = context.Process(
            target=serve, args=(listening, theirs, control), name=f"a3c-shard-{index}", daemon=True
        )
        self.proc.start()
        theirs.close()
        listening.close()

    def url(self, seen_as: str | None = None) -> str:
        """The shard's URL; for workers that reach the master at `seen_as`, its host where the
        shard listens on every address (as the receivers' URL is made)."""
        host = self.host
        if host in ("0.0.0.0", "::") and seen_as:
            host = urlsplit(seen_as).hostname or host
        return f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.is_alive()

    def stop(self) -> None:
        self._pipe.close()  # the shard ends when its pipe closes
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class RemoteShard:
    """A shard started elsewhere (A3C_SHARDS_URLS): alive while its status answers with the
    epoch the master opened it with (a shard started again holds none)."""

    def __init__(self, index: int, url: str) -> None:
        self.index, self._url = index, url.rstrip("/")
        self.healthy = True
        self.pid: int | None = None

    def url(self, seen_as: str | None = None) -> str:
        return self._url

    def alive(self) -> bool:
        return self.healthy

    def stop(self) -> None:
        """Not the master's to end."""


def ended(proc: ForkedShard | RemoteShard) -> str:
    if isinstance(proc, RemoteShard):
        return f"{proc.url()} does not answer, or holds no run: started again elsewhere"
    code = proc.proc.exitcode
    return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"


class ShardChannel:
    """The master's keep-alive connection to one shard, for its decisions (made again after a
    failure, or for a new URL): the standard library's client, which costs a fifth of httpx's
    CPU a request, and a push makes one for every shard when the shards keep up."""

    def __init__(self, settings: Settings, headers: httpx.Headers) -> None:
        self._tls = settings.tls.client_context() if settings.tls.configured else None
        self._headers = {**dict(headers), "Content-Type": "application/json"}
        self._url = ""
        self._conn: http.client.HTTPConnection | None = None

    def post(self, url: str, path: str, body: Any) -> tuple[int, str]:
        if self._conn is None or url != self._url:
            self.close()
            where = urlsplit(url)
            if where.scheme == "https":
                self._conn = http.client.HTTPSConnection(
                    where.hostname, where.port, timeout=30.0, context=self._tls
                )
            else:
                self._conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30.0)
            self._url = url
        self._conn.request("POST", path, body=json.dumps(body).encode(), headers=self._headers)
        reply = self._conn.getresponse()
        return reply.status, reply.read().decode()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
