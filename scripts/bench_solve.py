"""Benchmark: time to solve CartPole-v1 with a master and two workers on this host, and where the
workers spend their time (HTTP against rollouts and gradients).

    .venv/bin/python scripts/bench_solve.py [--runs 3] [--workers 2] [--config '{"seed": 1}']

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
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pydantic import ValidationError  # noqa: E402

from a3c_http.config.training import TrainConfig  # noqa: E402
from a3c_http.server.service import describe_error  # noqa: E402
from a3c_http.testing.localcluster import LocalCluster, free_port  # noqa: E402


def config_overrides(text: str, reserved: tuple[str, ...] = (), why: str = "") -> dict:
    """`--config`: a JSON object of training config fields for every run, checked as the master
    checks a config; the `reserved` fields (the caller's own) are refused, with `why`. Raises
    ValueError naming the problem."""
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(overrides, dict):
        raise ValueError("give a JSON object of config fields, e.g. '{\"max_in_flight\": 0}'")
    taken = sorted(set(overrides) & set(reserved))
    if taken:
        raise ValueError(f"{', '.join(taken)}: {why}")
    try:
        TrainConfig(**overrides)
    except ValidationError as exc:
        raise ValueError("; ".join(describe_error(e, "config") for e in exc.errors())) from None
    return overrides


def one_run(index: int, n_workers: int, overrides: dict, cap_s: float) -> dict:
    """Run `index` (its seed, unless `overrides` gives one) with `n_workers` workers, for at
    most `cap_s` seconds once started."""
    with tempfile.TemporaryDirectory(prefix="a3c-bench-") as tmp:
        cluster = LocalCluster(
            Path(tmp) / "run",
            Path(tmp) / "logs",
            [("127.0.0.1", free_port()) for _ in range(n_workers)],
        )
        try:
            cluster.start()
            reply = cluster.train(**{"seed": index, **overrides})
            reply.raise_for_status()
            started = time.monotonic()
            limits: list[int] = []  # the workers' in-flight limits, sampled while it runs
            while (status := cluster.status())["state"] == "running":
                if time.monotonic() - started > cap_s:  # the cap: report the run as it stands
                    break
                for w in cluster.workers:
                    limits.append(cluster.worker_status(w)["exchanges"]["in_flight_limit"])
                time.sleep(1.0)  # the sampling interval, not a synchronisation
            wall = time.monotonic() - started
            workers = [cluster.worker_status(w) for w in cluster.workers]
        finally:
            cluster.close()
    spent = {k: sum(w["time"][k] for w in workers) for k in ("rollout_s", "learn_s", "http_s")}
    total = sum(spent.values()) or 1.0
    # The master's clock once the run is solved or finished (at max_steps); else the cap's.
    finished = status["solved"] or status["state"] == "finished"
    return {
        "solved": status["solved"],
        "seconds": status["elapsed_s"] if finished else wall,
        "episodes": status["global_episode"],
        "steps": status["global_steps"],
        "env_steps": status["env_steps"],
        "mean_return_100": status["mean_return_100"],
        "updates": status["updates_applied"],
        "rejected": status["updates_rejected"],
        "rejected_by": {k: v for k, v in status["updates_rejected_by"].items() if v},
        "refused_share": status["updates_rejected"]
        / max(status["updates_applied"] + status["updates_rejected"], 1),
        "staleness_mean": status["staleness_mean"],
        "in_flight_limit": statistics.median(limits) if limits else None,
        "steps_per_s": status["global_steps"] / max(status["elapsed_s"], 1e-9),
        "http_share": spent["http_s"] / total,
        "rollout_share": spent["rollout_s"] / total,
        "learn_share": spent["learn_s"] / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="how many runs, one seed each (3)")
    parser.add_argument("--workers", type=int, default=2, help="workers of each run (2)")
    parser.add_argument("--config", default="{}", help="training config overrides as JSON")
    parser.add_argument(
        "--cap", type=float, default=600.0, help="seconds before a run gives up (600)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of the first run (0)")
    parser.add_argument("--json", action="store_true", help="print the runs as JSON at the end")
    args = parser.parse_args()
    try:
        overrides = config_overrides(args.config)
    except ValueError as exc:
        parser.error(f"--config {args.config!r}: {exc}")
    results = []
    for i in range(args.seed, args.seed + args.runs):
        r = one_run(i, args.workers, overrides, args.cap)
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


if __name__ == "__main__":
    main()
