"""A TCP proxy on loopback that loses replies: the faults a flaky network does to HTTP.

Every connection is forwarded to the upstream service. With probability `drop_reply_p`, the first
bytes of a reply are thrown away and both connections are closed: the service has done the work,
but the client never learns it and must retry. That is the case that double-counts a
non-idempotent POST unless the service recognises the retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading


class FaultProxy:
    def __init__(self, upstream_port: int, drop_reply_p: float, seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.drop_reply_p = drop_reply_p
        self.random = random.Random(seed)
        self.replies = 0  # reply chunks forwarded
        self.dropped = 0  # replies lost on purpose
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)
        return self

    def close(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return

        async def requests() -> None:
            while data := await client_r.read(65536):
                up_w.write(data)
                await up_w.drain()

        async def replies() -> None:
            while data := await up_r.read(65536):
                if self.random.random() < self.drop_reply_p:
                    self.dropped += 1
                    return
                self.replies += 1
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.create_task(requests()), asyncio.create_task(replies())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in (client_w, up_w):
            with contextlib.suppress(Exception):
                writer.close()
