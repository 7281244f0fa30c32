"""The simulated actors' pushes in a run with parameter-server shards (scripts/benchlib/load.py
`push_level` with `shards`): a push's three steps as a3c_http/net/shards.py makes them, written
by hand as load.py writes its requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from a3c_http.wire import tensors as wire
from a3c_http.wire.protocol import SEQ_HEADER, WORKER_ID_HEADER

if TYPE_CHECKING:
    from scripts.benchlib.load import Body

# load.py's reader of a reply whose body it drops (a shard's weights).
Reply = Callable[[asyncio.StreamReader], Awaitable[tuple[int, dict[str, str]]]]


async def reply_json(reader: asyncio.StreamReader) -> tuple[int, dict]:
    """Read one HTTP/1.1 reply with a small JSON body: its status and the body."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ", 2)[1])
    length = next(
        int(line.partition(":")[2]) for line in head if line.lower().startswith("content-length:")
    )
    return status, json.loads(await reader.readexactly(length)) if length else {}


@dataclass(frozen=True)
class Shards:
    """A run's parameter-server shards as its actors push to them (master/shards/): the epoch,
    each shard's (host, port, lo, hi), and the token-free master's commit path."""

    epoch: str
    places: list[tuple[str, int, int, int]]

    def bodies(self, bodies: list[Body], layout: wire.Layout) -> list[list[bytes]]:
        """Each body's gradients cut into the shards' slices, encoded as a worker stages them."""
        out = []
        for body in bodies:
            vector, _ = layout.decode(body.data)
            out.append([
                wire.Layout([("slice", (hi - lo,))], hi - lo, layout.dtype).encode(vector[lo:hi])
                for _, _, lo, hi in self.places
            ])  # fmt: skip
        return out


async def sharded_push(
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
    master: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    shards: Shards,
    slices: list[bytes],
    worker: str,
    run_id: str,
    seq: int,
    seen: int,
    body: Body,
    master_host: str,
    read_reply: Reply,
) -> tuple[int, dict]:
    """One push's three steps (a3c_http/net/shards.py): stage on every shard, commit, fetch."""

    async def stage(i: int) -> dict:
        reader, writer = conns[i]
        host, port, _, _ = shards.places[i]
        writer.write(
            (
                f"POST /shard/stage HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: {wire.CONTENT_TYPE}\r\nContent-Length: {len(slices[i])}\r\n"
                f"{WORKER_ID_HEADER}: {worker}\r\n{SEQ_HEADER}: {seq}\r\n"
                f"X-A3C-Shard-Epoch: {shards.epoch}\r\n\r\n"
            ).encode()
            + slices[i]
        )
        status, receipt = await reply_json(reader)
        if status != 200:
            raise Refused(f"stage {status}")
        return receipt

    receipts = await asyncio.gather(*(stage(i) for i in range(len(conns))))
    commit = json.dumps({
        "worker_id": worker, "run_id": run_id, "version": seen, "seq": seq, "loss": body.loss,
        "grad_norm": body.norm, "receipts": receipts,
    }).encode()  # fmt: skip
    reader, writer = master
    writer.write(
        f"POST /shards/commit HTTP/1.1\r\nHost: {master_host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(commit)}\r\n\r\n".encode()
        + commit
    )
    status, reply = await reply_json(reader)
    if status != 200:
        return status, reply

    async def fetch(i: int) -> None:
        reader, writer = conns[i]
        host, port, _, _ = shards.places[i]
        writer.write(
            f"GET /shard/weights?version={reply['version']} HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n\r\n".encode()
        )
        got, _ = await read_reply(reader)
        if got != 200:
            raise Refused(f"fetch {got}")

    await asyncio.gather(*(fetch(i) for i in range(len(conns))))
    return status, reply


class Refused(Exception):
    """A shard refused a stage or a fetch (the simulated worker ends with it)."""
