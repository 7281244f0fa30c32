"""The processes of a run's shards as the master sees them (master/shards/coordinator.py): one it
forked from its fork server (`ForkedShard`), or one started elsewhere (`RemoteShard`,
A3C_SHARDS_URLS)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

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
