"""master/ingress/receivers.py `_Channel`, the master's end of a receiver's socket pair, on an event
loop of the test's own with a stand-in for the master's hot path: every push read gets its answer,
framed back with its id, whether the hot path answered it at once or later, and a receiver that
stops reading its answers holds neither the loop nor more of the master's memory than the
transport's buffer: the channel reads none of its pushes until the answers drain, then goes on."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from a3c_http.wire.frames import Frames, frame
from a3c_http.wire.protocol import VERSION_HEADER, WORKER_ID_HEADER
from master.ingress.receivers import _Channel

WEIGHTS = b"w" * 100_000  # an answer far larger than a push: they back up first


class StandInReceivers:
    """What a channel needs of master/ingress/receivers.py `Receivers`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.forwarded = 0
        self.tasks: set[asyncio.Task] = set()
        self.lost_receivers: list[Any] = []

    def spawn(self, coroutine: Any) -> None:
        task = self.loop.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def take_push(self, path: str, headers: Any, body: bytes) -> Any:
        """Answered at once, as a push in async mode is; every other push's answer comes later,
        as a sync round's does."""
        reply = 200, [("x-a3c-worker", headers.worker_id), ("x-path", path)], WEIGHTS
        return self._later(reply) if int(headers.worker_id[1:]) % 2 else reply

    async def _later(self, reply: Any) -> Any:
        await asyncio.sleep(0)
        return reply

    def lost(self, receiver: Any) -> None:
        self.lost_receivers.append(receiver)


class StandInReceiver:
    index = 0


def pushes(first: int, count: int) -> bytes:
    return b"".join(
        frame(
            {
                "id": i,
                "path": "/gradients",
                "headers": {WORKER_ID_HEADER: f"w{i}", VERSION_HEADER: 0},
            },
            b"g" * 10,
        )
        for i in range(first, first + count)
    )


async def until(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    """Let the loop run until `condition()` holds (the loop, not a sleep, moves things on)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def test_a_receiver_that_stops_reading_is_read_no_more_and_gets_every_answer_once_it_does() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        receivers = StandInReceivers(loop)
        channel = _Channel(receivers, StandInReceiver())  # type: ignore[arg-type]
        await loop.connect_accepted_socket(lambda: channel, sock=ours)
        transport = channel.transport
        assert transport is not None

        # 50 pushes whose answers (5 MB) the receiver does not read: the channel stops reading.
        await loop.sock_sendall(theirs, pushes(0, 50))
        await until(lambda: receivers.forwarded == 50 and not receivers.tasks, "50 pushes answered")
        await until(lambda: not transport.is_reading(), "the channel to stop reading")
        assert transport.get_write_buffer_size() > 0  # the answers wait in the loop, unsent
        # More pushes wait in the socket, unread, while the loop goes on serving the rest.
        await loop.sock_sendall(theirs, pushes(50, 10))
        for _ in range(100):
            await asyncio.sleep(0)
        assert receivers.forwarded == 50

        # The receiver reads: every answer arrives, once, and the channel reads again.
        answers: dict[int, tuple[dict, bytes]] = {}
        frames = Frames()
        while len(answers) < 60:
            data = await asyncio.wait_for(loop.sock_recv(theirs, 1 << 20), 10)
            assert data, "the channel closed"
            for head, body in frames.feed(data):
                assert head["id"] not in answers
                answers[head["id"]] = (head, body)
        assert sorted(answers) == list(range(60)) and receivers.forwarded == 60
        for i, (head, body) in answers.items():
            assert head["status"] == 200 and body == WEIGHTS
            assert ["x-a3c-worker", f"w{i}"] in head["headers"]
        assert transport.is_reading()

        theirs.close()
        await until(lambda: receivers.lost_receivers, "the closed channel to be reported")

    asyncio.run(scenario())
