"""A TCP proxy on loopback that delays each direction by a fixed time: a master far away, for the
benchmarks (scripts/bench.py) and the tests, without touching the machine's network settings.

Each direction of a connection is a delay line: a reader task stamps every chunk with the time it
is due (when it was read, plus the delay) and queues it; a writer task delivers each chunk once it
is due. Bytes therefore flow at the link's own rate and each arrives `delay_s` late, as over a
long wire, rather than one chunk per delay. Every byte is forwarded, in order, and an end of
stream is passed on (delayed too) as a half-close; `bytes_up` (client to upstream) and
`bytes_down` count the bytes delivered. The proxy runs its own asyncio loop in its own thread
(`LoopbackProxy`, which the tests' FaultProxy, a proxy that loses replies, shares).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, Self

_CHUNK = 65536
# Chunks a direction may hold in flight: bounds the memory of a slow reader, not the throughput
# (64 MiB in flight per direction, far above a delay times loopback's rate).
_MAX_QUEUED = 1024


class LoopbackProxy:
    """A TCP proxy with its own asyncio loop in its own thread: every connection to `port` is
    handed to `_handle` (subclasses forward it to the upstream service their way)."""

    def __init__(self, upstream_port: int, upstream_host: str, host: str) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"proxy-{upstream_port}", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)
        return self

    def close(self) -> None:
        """Drop every connection and end the proxy's thread."""

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.get_running_loop().shutdown_default_executor()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_closed() and not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._handle, self.host, 0)
        return self._server.sockets[0].getsockname()[1]

    # When a connection pair is done: when one of its tasks ends (or only when one fails).
    until = asyncio.FIRST_COMPLETED

    def _forward(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
    ) -> list[Coroutine[Any, Any, None]]:
        """The tasks that carry one connection's bytes to the upstream and back."""
        raise NotImplementedError

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        tasks = [asyncio.create_task(c) for c in self._forward(client_r, client_w, up_r, up_w)]
        try:
            await asyncio.wait(tasks, return_when=self.until)
        except asyncio.CancelledError:
            pass  # close(): end quietly (Python 3.11's start_server logs a cancelled handler)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in (client_w, up_w):
                with contextlib.suppress(Exception):
                    writer.close()


class DelayProxy(LoopbackProxy):
    def __init__(
        self,
        upstream_port: int,
        delay_s: float,
        upstream_host: str = "127.0.0.1",
        host: str = "127.0.0.1",
    ) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        super().__init__(upstream_port, upstream_host, host)
        self.delay_s = delay_s
        self.bytes_up = 0  # client -> upstream, delivered
        self.bytes_down = 0  # upstream -> client, delivered
        self.connections = 0

    # Both ends closed in both directions, or a connection failed: the pair is done.
    until = asyncio.FIRST_EXCEPTION

    def _forward(self, client_r, client_w, up_r, up_w) -> list[Coroutine[Any, Any, None]]:
        self.connections += 1
        up: asyncio.Queue = asyncio.Queue(_MAX_QUEUED)
        down: asyncio.Queue = asyncio.Queue(_MAX_QUEUED)
        return [
            self._read(client_r, up),
            self._deliver(up, up_w, upward=True),
            self._read(up_r, down),
            self._deliver(down, client_w, upward=False),
        ]

    async def _read(self, reader: asyncio.StreamReader, queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(_CHUNK)
            await queue.put((loop.time() + self.delay_s, data))
            if not data:  # the end of the stream travels down the line like the bytes
                return

    async def _deliver(
        self, queue: asyncio.Queue, writer: asyncio.StreamWriter, upward: bool
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            while (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            if upward:
                self.bytes_up += len(data)
            else:
                self.bytes_down += len(data)
            writer.write(data)
            await writer.drain()
