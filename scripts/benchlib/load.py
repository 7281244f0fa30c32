"""The load generator of simulated workers: ready-made pushes (gradients, or an experience
algorithm's rollouts) to a real master as fast as it answers, for the bar's `master` section
(`scripts/bench.py --sections master`), `bench.py tls` and `bench.py load`.

It must cost little CPU, so that it measures the master and not itself: one asyncio process
(uvloop when importable), one keep-alive connection per simulated worker, and hand-written
HTTP/1.1: the request's bytes are written as they are, and the reply is read as a status line,
headers and a Content-Length body. Each request is a real `POST /gradients` as docs/http-api.md
describes it (a safetensors body, X-Worker-Id, X-Model-Version = the version of that worker's
last reply, X-Run-Id, a rising X-A3C-Seq, X-A3C-Loss and X-A3C-Grad-Norm), or a real
`POST /experience` (a rollout's body, without the loss and the norm).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import signal
import ssl
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from safetensors.torch import save as st_save

from a3c_http.wire import tensors as wire
from a3c_http.wire.protocol import (
    DUPLICATE_HEADER,
    GRAD_NORM_HEADER,
    LOSS_HEADER,
    RUN_ID_HEADER,
    SEQ_HEADER,
    VERSION_HEADER,
    WORKER_ID_HEADER,
)
from scripts.benchlib.shard_push import Refused, Shards, sharded_push

try:
    import uvloop
except ImportError:  # asyncio's own loop: the figures then include a slower client
    uvloop = None

# A reply slower than this counts as an error (and ends that simulated worker).
REPLY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Body:
    """One ready-made body: gradients, with the loss and norm a worker would report for them, or
    a rollout (no loss, no norm)."""

    data: bytes
    loss: float | None = None
    norm: float | None = None


# Who writes a body (`ready_bodies`): a worker (its layout, a3c_http/wire/tensors.py `Layout`), or
# another client, as safetensors' own writer lays out the same tensors given in reverse order.
WRITERS = ("layout", "safetensors")


def ready_bodies(
    layout: wire.Layout, count: int = 8, seed: int = 0, writer: str = "layout"
) -> list[Body]:
    """`count` gradient bodies of the model's shape with random values, as `writer` writes them
    (`WRITERS`: the same values either way), whose norms (about 0.4, never above the default
    clipping of 0.5, as the master insists) and losses (about 1) vary by about 10 % from one to
    the next: the master's outlier check judges them against a window with some spread, as in a
    real run, and refuses none."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        tensors = {name: torch.randn(shape, generator=gen) for name, shape in layout.spec.items()}
        norm = min(0.5, 0.4 * math.exp(0.1 * torch.randn((), generator=gen).item()))
        total = math.sqrt(sum(float(t.pow(2).sum()) for t in tensors.values()))
        tensors = {name: t * (norm / total) for name, t in tensors.items()}
        loss = math.exp(0.1 * torch.randn((), generator=gen).item())
        if writer == "layout":
            data = layout.encode(layout.flatten(tensors))
        else:
            backwards = {n: tensors[n].to(layout.dtypes[n]) for n in reversed(layout.names)}
            data = st_save(backwards)
        out.append(Body(data, loss, norm))
    return out


@dataclass
class Level:
    """What one level of concurrency measured. `ok`, `errors` and `duplicates` count the whole
    level (warm-up included: what the master's counters saw); `window_ok` and `latencies_ms`
    only the replies that arrived within the measured window."""

    workers: int
    client_cpu: float = 0.0  # this process's CPU time over the level's wall time
    wall_s: float = 0.0  # the level's wall time, warm-up included
    window_s: float = 0.0
    window_ok: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    ok: int = 0
    duplicates: int = 0
    errors: Counter = field(default_factory=Counter)

    def summary(self) -> dict:
        lat = sorted(self.latencies_ms)

        def q(p: float) -> float | None:  # the nearest-rank percentile
            return round(lat[max(0, math.ceil(p * len(lat)) - 1)], 3) if lat else None

        return {
            "workers": self.workers,
            "pushes_per_s": round(self.window_ok / self.window_s, 1) if self.window_s else None,
            "p50_ms": round(statistics.median(lat), 3) if lat else None,
            "p99_ms": q(0.99),
            "max_ms": round(lat[-1], 3) if lat else None,
            "window_s": round(self.window_s, 3),
            "client_cpu": round(self.client_cpu, 3),
            "window_pushes": self.window_ok,
            "ok": self.ok,
            "duplicates": self.duplicates,
            "errors": dict(self.errors),
        }


async def _reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """Read one HTTP/1.1 reply: its status and lower-case headers (the body is read and
    dropped as it comes: `readexactly` would gather a large model's 4 MB in the stream's buffer,
    growing and copying it, and then copy it out, which made this process the bottleneck of the
    1M model's rows in some runs)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ", 2)[1])
    headers = {}
    for line in head[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    left = int(headers["content-length"])
    while left:
        chunk = await reader.read(min(left, 1 << 20))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(chunk)
    return status, headers


async def _level(
    host: str,
    port: int,
    n: int,
    bodies: list[Body],
    run_id: str,
    version: int,
    warmup_s: float,
    window_s: float,
    max_count: int,
    tag: str,
    received: list[int],
    master_port: int,
    tls: ssl.SSLContext | None,
    path: str,
    shards: Shards | None = None,
    layout: wire.Layout | None = None,
) -> Level:
    level = Level(n)
    stop = asyncio.Event()
    # Ctrl-C or SIGTERM: end every connection first, then push_level passes the signal on.
    main, loop = asyncio.current_task(), asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda sig=sig: (received.append(sig), main.cancel()))
    window_start = time.perf_counter() + warmup_s
    # The window ends after window_s, or sooner once it holds max_count replies.
    window_end = [window_start + window_s]

    def measured(sent: float, done: float) -> None:
        """A reply that arrived in the window counts, and a full window ends the level."""
        if window_start <= done <= window_end[0]:
            level.window_ok += 1
            level.latencies_ms.append((done - sent) * 1000)
            if level.window_ok >= max_count:
                window_end[0] = done
                stop.set()

    async def simulated_worker(index: int) -> None:
        # What does not change from one request to the next, written once.
        fixed = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: {wire.CONTENT_TYPE}\r\n"
            f"{WORKER_ID_HEADER}: {tag}-{index}\r\n{RUN_ID_HEADER}: {run_id}\r\n"
        )
        seen = version
        writer = None
        try:
            # Only registered workers take part: each registers as a worker does, at the
            # master's own port (pushes may go to its receivers).
            status = await _register(host, master_port, f"{tag}-{index}", run_id, tls)
            if status != 200:
                level.errors[f"register {status}"] += 1
                return
            reader, writer = await asyncio.open_connection(host, port, ssl=tls)
            for seq in itertools.count(1):
                if stop.is_set():
                    return
                body = bodies[(index + seq) % len(bodies)]
                reported = "" if body.loss is None else (
                    f"{LOSS_HEADER}: {body.loss!r}\r\n{GRAD_NORM_HEADER}: {body.norm!r}\r\n")
                sent = time.perf_counter()
                writer.write(
                    (
                        f"{fixed}Content-Length: {len(body.data)}\r\n"
                        f"{VERSION_HEADER}: {seen}\r\n{SEQ_HEADER}: {seq}\r\n{reported}\r\n"
                    ).encode()
                )
                writer.write(body.data)
                status, headers = await asyncio.wait_for(_reply(reader), REPLY_TIMEOUT_S)
                done = time.perf_counter()
                if status not in (200, 204):  # 204: an experience push, the weights unchanged
                    level.errors[str(status)] += 1
                else:
                    level.ok += 1
                    seen = int(headers[VERSION_HEADER.lower()])
                    level.duplicates += headers.get(DUPLICATE_HEADER.lower()) == "1"
                    measured(sent, done)
                if headers.get("connection", "").lower() == "close":
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, KeyError) as exc:
            level.errors[type(exc).__name__] += 1  # this simulated worker ends with it
        finally:
            if writer is not None:
                writer.close()

    async def sharded_worker(index: int) -> None:
        assert shards is not None and layout is not None
        worker, seen, opened = f"{tag}-{index}", version, []
        try:
            status = await _register(host, master_port, worker, run_id, tls)
            if status != 200:
                level.errors[f"register {status}"] += 1
                return
            for shard_host, shard_port, _, _ in shards.places:
                opened.append(await asyncio.open_connection(shard_host, shard_port, ssl=tls))
            master = await asyncio.open_connection(host, master_port, ssl=tls)
            opened.append(master)
            for seq in itertools.count(1):
                if stop.is_set():
                    return
                at = (index + seq) % len(bodies)
                sent = time.perf_counter()
                status, reply = await asyncio.wait_for(
                    sharded_push(opened[:-1], master, shards, sliced[at], worker, run_id, seq,
                                  seen, bodies[at], f"{host}:{master_port}", _reply),
                    REPLY_TIMEOUT_S,
                )  # fmt: skip
                if status != 200:
                    level.errors[str(status)] += 1
                    continue
                level.ok += 1
                seen = int(reply["version"])
                level.duplicates += bool(reply.get("duplicate"))
                measured(sent, time.perf_counter())
        except (OSError, asyncio.IncompleteReadError, TimeoutError, KeyError, Refused) as exc:
            level.errors[str(exc) if isinstance(exc, Refused) else type(exc).__name__] += 1
        finally:
            for _, writer in opened:
                writer.close()

    sliced = shards.bodies(bodies, layout) if shards is not None and layout is not None else []
    actor = sharded_worker if shards is not None else simulated_worker
    workers = [asyncio.create_task(actor(i)) for i in range(n)]
    try:
        # Only a full window (max_count) sets `stop` before the window's end.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), window_end[0] - time.perf_counter())
        stop.set()
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    level.window_s = window_end[0] - window_start
    return level


async def _register(
    host: str, port: int, worker_id: str, run_id: str, tls: ssl.SSLContext | None = None
) -> int:
    """POST /worker_started on a connection of its own; the reply's status."""
    reader, writer = await asyncio.open_connection(host, port, ssl=tls)
    try:
        hello = json.dumps({"worker_id": worker_id, "run_id": run_id}).encode()
        writer.write(
            f"POST /worker_started HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(hello)}\r\n\r\n".encode()
            + hello
        )
        status, _ = await asyncio.wait_for(_reply(reader), REPLY_TIMEOUT_S)
        return status
    finally:
        writer.close()


def push_level(
    host: str,
    port: int,
    n: int,
    bodies: list[Body],
    run_id: str,
    version: int,
    warmup_s: float,
    window_s: float,
    max_count: int,
    tag: str,
    master_port: int | None = None,
    tls: ssl.SSLContext | None = None,
    path: str = "/gradients",
    shards: Shards | None = None,
    layout: wire.Layout | None = None,
) -> Level:
    """`n` simulated workers push `bodies` (in turn) to `path` on `port` (gradients; or
    "/experience", rollouts) as fast as the master answers:
    `warmup_s` unmeasured, then a window of `window_s` (or up to `max_count` replies); each then
    finishes its request in flight, so the master's counters are final when this returns. Each
    registers first at `master_port` (default: `port`; another when `port` is the master's
    receivers'). A SIGINT or SIGTERM meanwhile closes every connection and then goes to the
    caller's own handler. With `tls` (a client context), every connection is HTTPS. With
    `shards` (and the run's wire `layout`), each push is staged on every shard, committed to the
    master and its weights fetched from every shard, as a worker of such a run pushes."""
    received: list[int] = []
    coro = _level(
        host, port, n, bodies, run_id, version, warmup_s, window_s, max_count, tag, received,
        master_port or port, tls, path, shards, layout,
    )
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        level = uvloop.run(coro) if uvloop is not None else asyncio.run(coro)
    except asyncio.CancelledError:
        if not received:
            raise
    finally:  # the loop's signal handling ends with it: the caller's handlers are back
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if received:
        signal.raise_signal(received[0])
    level.wall_s = time.perf_counter() - wall
    level.client_cpu = (time.process_time() - cpu) / level.wall_s
    return level
