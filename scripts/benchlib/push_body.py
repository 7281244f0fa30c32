"""Benchmark: the master's CPU a gradient push by who wrote its body, a worker (its layout,
a3c_http/wire/tensors.py `Layout`) or another client (safetensors.torch.save of the same tensors
given in reverse order: scripts/benchlib/load.py `WRITERS`).

    .venv/bin/python scripts/bench.py push_body [--model default] [--workers 16] [--rounds 3]
        [--warmup 2] [--window 6] [--reps 2000] [--json runs/bench_push_body.json]

One master with a stand-in worker (scripts/benchlib/server.py `standin_master`) runs the model; per
round, for each writer in turn (alternating, so that the machine's other load falls on both),
--workers simulated workers push that writer's bodies as fast as the master answers
(scripts/benchlib/load.py `push_level`: a warm-up, then a window). The master's CPU over the level
(user + system of its process, /proc) divided by the pushes it answered (applied or refused) is
that round's figure; the medians over the rounds are printed. Then the decoder alone in this
process: the median over --reps calls of `Layout.decode` of each writer's body, as the master
decodes a push (`finite_params=False`). The code measured is whatever `a3c_http` and `master`
this process imports: run it with another checkout first on PYTHONPATH (and as the working
directory) to measure that one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from a3c_http.algos.registry import model_for
from a3c_http.local.cluster import cpu_delta
from a3c_http.wire import tensors as wire
from scripts.benchlib.load import WRITERS, push_level, ready_bodies
from scripts.benchlib.report import ROOT, say
from scripts.benchlib.server import MASTER_RUNS, standin_master, start_run


def decode_us(layout: wire.Layout, body: bytes, reps: int) -> float:
    """The median time of the master's decoding of `body`, in microseconds (batches of 20)."""
    times = []
    for _ in range(max(1, reps // 20)):
        started = time.perf_counter()
        for _ in range(20):
            layout.decode(body, finite_params=False)
        times.append((time.perf_counter() - started) / 20 * 1e6)
    return round(statistics.median(times), 2)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", choices=sorted(MASTER_RUNS))
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "bench_push_body.json")
    args = parser.parse_args(argv)
    say(f"code measured: {Path(wire.__file__).resolve().parent.parent}")
    hidden, dtype, extra = MASTER_RUNS[args.model]
    rounds: dict[str, list[dict]] = {writer: [] for writer in WRITERS}
    with standin_master() as (cluster, worker):
        run_id, config = start_run(cluster, worker, hidden, dtype, **extra)
        layout = wire.Layout.of(model_for(config), dtype)
        bodies = {writer: ready_bodies(layout, writer=writer) for writer in WRITERS}
        for i in range(args.rounds):
            for writer in WRITERS:
                before, cpu = cluster.status(), cluster.master.cpu_seconds()
                level = push_level(
                    cluster.master.host,
                    cluster.master.port,
                    args.workers,
                    bodies[writer],
                    run_id,
                    before["model_version"],
                    args.warmup,
                    args.window,
                    10**9,
                    tag=f"body-{writer}-{i}",
                )
                after, now = cluster.status(), cluster.master.cpu_seconds()
                used = cpu_delta(cpu, now) or 0.0
                counters = ("updates_applied", "updates_rejected")
                answered = sum(after[k] - before[k] for k in counters)
                row = {
                    "pushes_per_s": level.summary()["pushes_per_s"],
                    "answered": answered,
                    "rejected": after["updates_rejected"] - before["updates_rejected"],
                    "errors": level.summary()["errors"],
                    "master_ms_per_push": round(used * 1000 / max(answered, 1), 4),
                }
                rounds[writer].append(row)
                say(
                    f"  round {i + 1}, {writer}: {row['master_ms_per_push']} ms of the master's "
                    f"CPU a push, {row['pushes_per_s'] or 0:,.0f} pushes/s, "
                    f"{row['rejected']} refused, {row['errors'] or 0} errors"
                )
    out = {"model": args.model, "workers": args.workers, "rounds": rounds, "writers": {}}
    for writer in WRITERS:
        body = bodies[writer][0].data
        out["writers"][writer] = {
            "body_bytes": len(body),
            "master_ms_per_push": statistics.median(
                r["master_ms_per_push"] for r in rounds[writer]
            ),
            "decode_us": decode_us(layout, body, args.reps),
        }
        say(
            f"{writer}: master {out['writers'][writer]['master_ms_per_push']} ms CPU a push "
            f"(median of {args.rounds}), decode {out['writers'][writer]['decode_us']} us"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    return 0
