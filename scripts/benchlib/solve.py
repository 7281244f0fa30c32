"""Benchmark: time to solve CartPole-v1 with a master and two workers on this host, and where the
workers spend their time (HTTP against rollouts and gradients).

    .venv/bin/python scripts/bench.py solve [--runs 3] [--workers 2] [--config '{"seed": 1}']

Each run starts fresh uvicorn processes on free loopback ports, POSTs /train with the default
config (plus --config; run i has seed --seed + i unless --config gives one) and waits for the run
to finish. Prints one line per run and the medians; with --json, the runs as JSON too. Each line
says what staleness shows (README, "Staleness"): the mean staleness of the applied gradients, the
pushes refused (of all the master judged) and the workers' pushes in flight, sampled every second.
"""

from __future__ import annotations

import argparse
import json
import statistics

from scripts.benchlib.cluster import fresh_run
from scripts.benchlib.options import config_overrides


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="how many runs, one seed each (3)")
    parser.add_argument("--workers", type=int, default=2, help="workers of each run (2)")
    parser.add_argument("--config", default="{}", help="training config overrides as JSON")
    parser.add_argument(
        "--cap", type=float, default=600.0, help="seconds before a run gives up (600)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of the first run (0)")
    parser.add_argument("--json", action="store_true", help="print the runs as JSON at the end")
    args = parser.parse_args(argv)
    try:
        overrides = config_overrides(args.config)
    except ValueError as exc:
        parser.error(f"--config {args.config!r}: {exc}")
    results = []
    for i in range(args.seed, args.seed + args.runs):
        r = fresh_run(i, args.workers, overrides, args.cap)
        results.append(r)
        print(
            f"run {i}: {'solved' if r['solved'] else 'NOT solved'} in {r['seconds']:.0f} s, "
            f"{r['episodes']} episodes, {r['steps']:,} env steps ({r['steps_per_s']:,.0f}/s), "
            f"mean return {r['mean_return_100'] or 0:.0f}, {r['updates']} updates, "
            f"{r['rejected']} refused ({r['refused_share']:.1%} {r['rejected_by']}), staleness "
            f"{r['staleness_mean']}, in flight {r['in_flight_limit']}; worker time: "
            f"HTTP {r['http_share']:.0%}, rollouts {r['rollout_share']:.0%}, "
            f"gradients {r['learn_share']:.0%}",
            flush=True,
        )
    solved = [r["seconds"] for r in results if r["solved"]]
    print(
        f"solved {len(solved)}/{len(results)}; median time to solve: "
        + (f"{statistics.median(solved):.0f} s" if solved else "-")
    )
    for key in ("steps_per_s", "http_share", "rollout_share", "learn_share"):
        med = statistics.median(r[key] for r in results)
        print(f"median {key}: " + (f"{med:.0%}" if key.endswith("share") else f"{med:,.0f}"))
    if args.json:
        print(json.dumps(results))
    return 0
