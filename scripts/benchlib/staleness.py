"""Benchmark: what the staleness of W workers does to learning, on a host without W cores: env
steps to a task's target for each number of workers and each lag, over seeds.

    .venv/bin/python scripts/bench.py staleness [--workers 1,2,4,8,16] [--lags 1,2] [--seeds 3]
        [--task CartPole-v1] [--config '{"hidden_sizes": [700, 700]}'] [--budget N]

The learner in one process plays the workers in turn (a3c_http/algos/a3c/single_process.py): each
computes its rollouts on its own copy of the weights, the master's step applies them, and the worker
loads the weights of the step after its own push `lag` turns before. Lag 1 is a worker that waits
for each reply (`max_in_flight: 0`): every update is W - 1 versions old. Lag 2 is one that keeps a
push in flight while it computes the next, as the cluster's workers on loopback: 2W - 1 (README,
"Staleness"). A cluster's timing spreads the staleness around these figures; here it is exact, and a
run can be repeated. On a host with a core per worker, each worker steps its environments at about
one worker's rate, so the time to the target goes as the env steps it takes over W: the table's "per
worker" column, whose fall with W is what more workers buy.

Runs one after another, with one torch thread. Prints a line per run and a table, and writes the
runs to --json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from a3c_http.algos.a3c.single_process import train
from a3c_http.algos.registry import train_config
from scripts.benchlib.options import config_overrides, counts
from scripts.benchlib.procs import end_on_signals
from scripts.benchlib.report import ROOT, commit, fmt, say, table
from scripts.benchlib.tasks import TASKS, require_env

OWN_FIELDS = ("env_id", "seed", "max_steps")
OWN_WHY = "set by this script (--task, the run's seed, --budget)"


def one_run(env_id: str, workers: int, lag: int, seed: int, overrides: dict, budget: int) -> dict:
    """Train `env_id` to its target with `workers` played in turn `lag` replies behind."""
    config = train_config(**{**overrides, "env_id": env_id, "seed": seed, "max_steps": budget})
    r = train(config, budget, workers=workers, lag=lag)
    return {"workers": workers, "lag": lag, "seed": seed, "solved": r.solved,
            "env_steps": r.env_steps, "updates": r.updates, "seconds": round(r.seconds, 2),
            "staleness_mean": round(r.staleness_mean or 0.0, 3),
            "mean_return_100": r.mean_return_100}


def summary(runs: list[dict]) -> list[dict]:
    """Per (workers, lag), in the order first run: how many runs solved, the medians of the
    solved runs' env steps (and their range) and updates, those env steps over the workers, and
    the mean staleness. The medians are of solved runs only, so read them beside `solved`."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["workers"], r["lag"]), []).append(r)
    rows = []
    for (workers, lag), group in groups.items():
        solved = [r for r in group if r["solved"]]
        steps = [r["env_steps"] for r in solved]
        median = statistics.median(steps) if steps else None
        rows.append({
            "workers": workers, "lag": lag, "runs": len(group), "solved": len(solved),
            "staleness_mean": statistics.fmean(r["staleness_mean"] for r in group),
            "env_steps_median": median,
            "env_steps_range": [min(steps), max(steps)] if steps else None,
            "updates_median": statistics.median(r["updates"] for r in solved) if solved else None,
            "env_steps_per_worker": None if median is None else median / workers,
        })
    return rows


def show(env_id: str, rows: list[dict], overrides: dict) -> None:
    title = f"{env_id}: env steps to the target, workers played in turn"
    if overrides:
        title += f" ({json.dumps(overrides)})"
    table(title + " (medians of the solved runs)",
          ["workers", "lag", "staleness", "solved", "env steps", "range", "updates", "per worker"],
          [[str(r["workers"]), str(r["lag"]), fmt(r["staleness_mean"], ".1f"),
            f"{r['solved']}/{r['runs']}", fmt(r["env_steps_median"]),
            "-" if r["env_steps_range"] is None else
            f"{r['env_steps_range'][0]:,}-{r['env_steps_range'][1]:,}",
            fmt(r["updates_median"]), fmt(r["env_steps_per_worker"])] for r in rows])


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8,16",
                        help="comma-separated numbers of workers (default 1,2,4,8,16)")
    parser.add_argument("--lags", default="1,2",
                        help="comma-separated lags: 1 waits for each reply, 2 keeps a push in "
                        "flight (default 1,2)")
    parser.add_argument("--seeds", type=int, default=3, help="runs per workers and lag (3)")
    parser.add_argument("--seed", type=int, default=0, help="the first run's seed (0)")
    parser.add_argument("--task", default="CartPole-v1",
                        help="a task of `scripts/bench.py learn` with a target: "
                        f"{', '.join(n for n, t in TASKS.items() if t.stop_at_target)} "
                        "(default CartPole-v1)")
    parser.add_argument("--budget", type=int, default=None,
                        help="env steps before a run gives up (default: twice the task's budget "
                        "in `scripts/bench.py learn`, 1,000,000 for CartPole-v1)")
    parser.add_argument("--config", default="{}",
                        help="training config fields for every run, as a JSON object, e.g. "
                        "'{\"hidden_sizes\": [700, 700]}' (default: the task's preset)")
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "bench_staleness.json",
                        help="where the runs go (default runs/bench_staleness.json)")
    args = parser.parse_args(argv)
    workers = counts("--workers", args.workers, parser)
    lags = counts("--lags", args.lags, parser)
    targets = [name for name, task in TASKS.items() if task.stop_at_target]
    if args.task not in targets:
        parser.error(f"--task {args.task!r}: give one of {', '.join(targets)}")
    if args.seeds < 1 or (args.budget is not None and args.budget < 1):
        parser.error("--seeds and --budget must be at least 1")
    try:
        overrides = config_overrides(args.config, OWN_FIELDS, OWN_WHY)
        require_env(args.task)
    except (ValueError, RuntimeError) as exc:
        parser.error(str(exc))
    budget = args.budget or 2 * TASKS[args.task].budget
    torch.set_num_threads(1)
    end_on_signals()
    figures: dict = {"meta": {
        "argv": argv, "task": args.task, "budget": budget, "config": overrides,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
        "torch": torch.__version__, "host": platform.node(), "commit": commit()},
        "runs": []}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    code = 0
    try:
        for n in workers:
            for lag in lags:
                for seed in range(args.seed, args.seed + args.seeds):
                    r = one_run(args.task, n, lag, seed, overrides, budget)
                    figures["runs"].append(r)
                    args.json.write_text(json.dumps(figures, indent=1))
                    say(f"  {n} worker{'s' * (n > 1)}, lag {lag}, seed {seed}: "
                        f"{'solved' if r['solved'] else 'not solved'} at {r['env_steps']:,} env "
                        f"steps ({r['updates']:,} updates, staleness {r['staleness_mean']:.1f}, "
                        f"mean return {fmt(r['mean_return_100'], '.1f')}, {r['seconds']:.0f} s)")
    except KeyboardInterrupt:
        figures["meta"]["interrupted"] = True
        say("\ninterrupted")
        code = 130
    figures["summary"] = summary(figures["runs"])
    if figures["summary"]:
        show(args.task, figures["summary"], overrides)
    args.json.write_text(json.dumps(figures, indent=1))
    say(f"\nfigures written to {args.json}")
    return code
