"""Benchmark: how the cluster scales with its number of workers on one host.

    .venv/bin/python scripts/bench.py scale [--workers 1,2,4,8] [--seeds 3] [--budget 150000]
        [--time-cap 600] [--model default,1M] [--config '{"max_in_flight": 0}'] [--receivers 2]
        [--pin] [--quick] [--json runs/bench_scale.json]

A master and as many workers as the largest N of --workers, each its own uvicorn process on a free
loopback port (a3c_http.local.cluster), started once; for each model and each N, one after
another (never two at once), runs that name N of the workers (the others sit idle):

- a steady-state window of a run of the default config (with the model's hidden_sizes, and the
  fields of --config) that does not end by itself: once every worker has reported and 10 % of
  --budget env steps are done (the warm-up), the master's GET /status and the processes' CPU
  times (/proc/<pid>/stat, utime + stime) are read, and read again once --budget more env steps
  are done (and at least MIN_WINDOW_S later). From the differences: env steps/s, updates
  applied/s, refusals/s by reason (`updates_rejected_by`), the window's own mean staleness
  (`staleness_total` over `updates_applied`), the master's CPU in cores and in ms per push
  handled (applied + refused), and the workers' CPU in cores (each worker with its push
  process). Scaling efficiency: rate(N) / (N / N0 x rate(N0)) of env steps/s, N0 the fewest
  workers measured (1 by default);
- the time and env steps to solve CartPole-v1 (target 475) for seeds 0 .. --seeds - 1 with the
  same config, each run capped at --time-cap seconds: a run that did not solve counts at the cap
  and is marked.

The default --workers are the powers of two up to the host's cores less one, the master's core,
and that number itself (1, 2, 4, 8, 15 on 16 cores, the row the scaling bar reads; 1 on 2): each
worker process then has a core, its push process and this script's polling (2 GET /status a
second) sharing them. `--pin` runs each process on one core
(taskset): the master on the first, worker i on the (i + 1)-th, around again past the last;
the master's receivers (--receivers k, or A3C_RECEIVERS=k) on the workers' cores, among the workers,
so that 15 workers and the master still fill 16 cores. The master's CPU counts its receivers';
`master_own_ms_per_push` is its own process's alone, which caps a master with receivers.
Prints a table per model and writes every figure to the JSON file after each window and each N's
solve runs, so a cut run keeps what it measured. `--quick` gives tiny budgets, only to check that
the script works. Ctrl-C or SIGTERM ends every process it started (by pid) and exits with what
was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from a3c_http.algos.registry import train_config
from a3c_http.config.settings import Settings
from a3c_http.local.cluster import (
    LocalCluster,
    ServiceProcess,
    cpu_delta,
    cpu_of,
    free_port,
    wait_for,
    with_descendants,
)
from scripts.benchlib.cluster import STEADY_FROM, UNREACHABLE, cluster_of, solve_run
from scripts.benchlib.options import config_overrides, counts
from scripts.benchlib.procs import default_workers, end_on_signals, host_cores, pin_sets
from scripts.benchlib.report import PROGRESS_S, ROOT, commit, fmt, say, table
from scripts.benchlib.server import MODELS, ms_a_push, n_params
from scripts.benchlib.tasks import TASKS

TARGET = TASKS["CartPole-v1"][0]
POLL_S = 0.5  # each poll is a GET /status the master serves too: 2 a second cost it little


@dataclass(frozen=True)
class Plan:
    budget: int  # env steps of each steady-state window
    min_window_s: float  # ... and at least this long
    window_cap_s: float  # the warm-up, and then the window, give up after this many seconds
    time_cap_s: float  # seconds before a run to the target gives up
    seeds: int

    @classmethod
    def of(cls, args: argparse.Namespace) -> Plan:
        if args.quick:
            return cls(args.budget or 3_000, 1.0, 30.0, args.time_cap or 3.0, args.seeds or 1)
        return cls(args.budget or 150_000, 5.0, 300.0, args.time_cap or 600.0, args.seeds or 3)


# The fields each run of this script sets itself (CartPole-v1; the model sets hidden_sizes).
OWN_FIELDS = ("env_id", "seed", "max_steps", "target_return", "hidden_sizes")
OWN_WHY = "set by this script (CartPole-v1; --model sets hidden_sizes)"


# -- the figures of a window (pure, on two readings) -------------------------------------------


def window_figures(n: int, first: dict, last: dict) -> dict:
    """A window's figures from its two readings: {"t": monotonic s, "status": GET /status,
    "master": cpu_of(the master and its receivers), "workers": cpu_of(workers and their children),
    and "master_own": cpu_of(the master's process alone), which may be left out}."""
    seconds = last["t"] - first["t"]
    a, b = first["status"], last["status"]

    def grown(key: str) -> int:
        return b[key] - a[key]

    applied, refused = grown("updates_applied"), grown("updates_rejected")
    by_reason = {k: v - a["updates_rejected_by"].get(k, 0)
                 for k, v in b["updates_rejected_by"].items()}
    by_reason = {k: v for k, v in by_reason.items() if v}
    master = cpu_delta(first["master"], last["master"])
    own = cpu_delta(first.get("master_own", {}), last.get("master_own", {}))
    workers = cpu_delta(first["workers"], last["workers"])
    rate = grown("env_steps") / seconds
    return {
        "workers": n, "window_s": round(seconds, 3), "env_steps": grown("env_steps"),
        "env_steps_per_s": round(rate, 1), "env_steps_per_s_per_worker": round(rate / n, 1),
        "updates": applied, "updates_per_s": round(applied / seconds, 1),
        "pushes_handled": applied + refused,
        "refused": by_reason,
        "refusals_per_s": {k: round(v / seconds, 2) for k, v in by_reason.items()},
        "staleness_mean": round(grown("staleness_total") / applied, 3) if applied else None,
        "master_cpu_s": None if master is None else round(master, 3),
        "master_cpu_cores": None if master is None else round(master / seconds, 3),
        "master_ms_per_push": ms_a_push(master, applied + refused, 4),
        # the master's process without its receivers: what caps a master that has them (full at
        # 1.0 core)
        "master_own_ms_per_push": ms_a_push(own, applied + refused, 4),
        "master_own_cpu_cores": None if own is None else round(own / seconds, 3),
        "workers_cpu_cores": None if workers is None else round(workers / seconds, 3),
    }


def add_efficiency(levels: list[dict]) -> None:
    """Each level's env steps/s over (N / N0) times that of N0, the fewest workers measured."""
    base = min(levels, key=lambda r: r["workers"])
    for r in levels:
        ideal = r["workers"] / base["workers"] * base["env_steps_per_s"]
        r["efficiency"] = round(r["env_steps_per_s"] / ideal, 4) if ideal else None
        r["efficiency_base"] = base["workers"]


# -- the measurements -----------------------------------------------------------------------------


def steady_window(
    cluster: LocalCluster, workers: list[ServiceProcess], hidden: list[int], plan: Plan,
    overrides: dict,
) -> dict:
    """One run of `workers` that never ends by itself; its figures over --budget env steps
    after the warm-up (window_figures), and whether the window reached its cap instead."""
    n = len(workers)
    cluster.train(**overrides, seed=0, max_steps=None, target_return=UNREACHABLE,
                  hidden_sizes=hidden, workers=[w.url for w in workers]).raise_for_status()
    warm = int(STEADY_FROM * plan.budget)

    def warmed() -> bool:
        s = cluster.status()
        if s["state"] != "running":
            raise RuntimeError(f"the run ended in its warm-up: {s.get('finish_reason')}")
        return sum(w["env_steps"] > 0 for w in s["workers"]) >= n and s["env_steps"] >= warm

    wait_for(warmed, plan.window_cap_s, f"{n} workers to report and {warm:,} env steps", POLL_S)
    # After the warm-up: each worker's push process runs by now.
    master_pids = with_descendants([cluster.master.pid])  # its receivers, if it has any
    worker_pids = with_descendants([w.pid for w in workers])

    def reading() -> dict:
        status = cluster.status()
        master = cpu_of(master_pids)
        own = {pid: s for pid, s in master.items() if pid == cluster.master.pid}
        return {"t": time.monotonic(), "status": status, "master": master, "master_own": own,
                "workers": cpu_of(worker_pids)}

    first = reading()
    said = [first["t"]]

    def done() -> dict | None:
        r = reading()
        if r["status"]["state"] != "running":
            raise RuntimeError(f"the run ended in its window: {r['status'].get('finish_reason')}")
        steps = r["status"]["env_steps"] - first["status"]["env_steps"]
        if r["t"] - said[0] >= PROGRESS_S:
            said[0] = r["t"]
            say(f"    {steps:,} env steps, {steps / (r['t'] - first['t']):,.0f}/s")
        return r if steps >= plan.budget and r["t"] - first["t"] >= plan.min_window_s else None

    try:
        last = wait_for(done, plan.window_cap_s, f"{plan.budget:,} env steps", POLL_S)
        capped = False
    except TimeoutError:
        last, capped = reading(), True
    cluster.stop_run()
    return {**window_figures(n, first, last), "capped": capped}


def solve(
    cluster: LocalCluster, workers: list[ServiceProcess], hidden: list[int], plan: Plan,
    overrides: dict,
) -> dict:
    """Time and env steps to CartPole-v1's target, seed by seed; unsolved runs at the cap."""
    runs = []
    for seed in range(plan.seeds):
        r = solve_run(cluster, plan.time_cap_s, f"solve, seed {seed}", **overrides, seed=seed,
                      hidden_sizes=hidden, workers=[w.url for w in workers])
        seconds = r["seconds"] if r["solved"] else plan.time_cap_s
        runs.append({"seed": seed, "solved": r["solved"], "seconds": round(seconds, 3),
                     "env_steps": r["env_steps"], "mean_return_100": r["mean_return_100"]})
        say(f"    seed {seed}: " + (f"solved in {seconds:.1f} s" if r["solved"] else
                                    f"NOT solved (counted at the cap, {seconds:g} s)")
            + f", {r['env_steps']:,} env steps")
    return {"target": TARGET, "cap_s": plan.time_cap_s, "runs": runs,
            "solved": sum(r["solved"] for r in runs),
            "median_s": statistics.median(r["seconds"] for r in runs),
            "median_env_steps": statistics.median(r["env_steps"] for r in runs)}


def show(name: str, model: dict, overrides: dict) -> None:
    rows = []
    for r in model["levels"]:
        s = r.get("solve") or {"solved": None, "runs": [], "median_s": None,
                               "median_env_steps": None}  # cut in its solve runs
        rows.append([
            str(r["workers"]) + ("*" if r["capped"] else ""), fmt(r["env_steps_per_s"]),
            fmt(r["env_steps_per_s_per_worker"]), fmt(r.get("efficiency"), ".2f"),
            fmt(r["updates_per_s"]),
            ", ".join(f"{k} {v:g}" for k, v in r["refusals_per_s"].items()) or "0",
            fmt(r["staleness_mean"], ".2f"), fmt(r["master_cpu_cores"], ".2f"),
            fmt(r["master_ms_per_push"], ".3f"), fmt(r["workers_cpu_cores"], ".2f"),
            f"{s['solved']}/{len(s['runs'])}" if s["runs"] else "-", fmt(s["median_s"], ".1f"),
            fmt(s["median_env_steps"]),
        ])
    config = f", config {json.dumps(overrides)}" if overrides else ""
    table(f"{name} model ({model['params']:,} parameters, hidden {model['hidden_sizes']}{config})",
          ["workers", "env steps/s", "per worker", "efficiency", "updates/s", "refusals/s",
           "staleness", "master cores", "ms/push", "workers cores", "solved", "median s",
           "median env steps"], rows)
    say("  efficiency: env steps/s at N over N times that at the fewest workers; ms/push: the "
        "master's CPU per push handled (applied + refused); solve: runs that did not solve "
        "count at the cap" + ("; * the window reached its cap before its budget"
                              if any(r["capped"] for r in model["levels"]) else ""))


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    cores = host_cores()
    parser.add_argument("--workers", default=None,
                        help="comma-separated numbers of workers, measured in this order "
                        "(default: powers of two up to this host's cores less the master's, and "
                        "that number)")
    parser.add_argument("--receivers", "--fronts", type=int, default=None,  # and its old name
                        help="give the master this many receivers (A3C_RECEIVERS, on a free "
                        "loopback port), whose CPU counts as the master's (default: A3C_RECEIVERS, "
                        "else 0)")
    parser.add_argument("--model", default="default",
                        help=f"comma-separated, of {', '.join(MODELS)} (default: default)")
    parser.add_argument("--seeds", type=int, default=None, help="solve runs per N (3; --quick 1)")
    parser.add_argument("--budget", type=int, default=None,
                        help="env steps of each steady-state window (150,000; --quick 3,000)")
    parser.add_argument("--time-cap", type=float, default=None,
                        help="seconds before a solve run gives up (600; --quick 3)")
    parser.add_argument("--config", default="{}",
                        help="training config fields for every run, as a JSON object, e.g. "
                        "'{\"max_in_flight\": 0}' (default: the default config)")
    parser.add_argument("--pin", action="store_true",
                        help="run each process on a core of its own (taskset)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny budgets, only to check that the script works")
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "bench_scale.json",
                        help="where the figures go (default runs/bench_scale.json)")
    args = parser.parse_args(argv)
    if args.receivers is not None:  # judged with the master's settings, below
        # The master this script starts reads them (by the names already set, if old ones).
        os.environ[Settings.variable("receivers")] = str(args.receivers)
        bind = Settings.variable("receivers_bind")
        if args.receivers and not os.environ.get(bind):
            os.environ[bind] = f"127.0.0.1:{free_port()}"
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    if not models or any(m not in MODELS for m in models):
        parser.error(f"--model {args.model!r}: give one or more of {', '.join(MODELS)}")
    try:
        overrides = config_overrides(args.config, OWN_FIELDS, OWN_WHY)
    except ValueError as exc:
        parser.error(f"--config {args.config!r}: {exc}")
    try:
        receivers = Settings.from_env().receivers  # the master's, which reads the same environment
    except ValueError as exc:
        parser.error(f"the master's settings: {exc}")
    workers = counts("--workers", args.workers or ",".join(map(str, default_workers(len(cores)))),
                     parser)
    pin = None
    if args.pin:
        if shutil.which("taskset"):
            pin = pin_sets(max(workers), cores)
        else:
            say("--pin: taskset is not installed (util-linux): the processes are not pinned")
    plan = Plan.of(args)
    end_on_signals()
    figures: dict = {"meta": {
        "argv": argv, "plan": asdict(plan), "workers": workers, "models": models,
        "config": overrides,
        "cores": len(cores), "cpu_count": os.cpu_count(), "pinned": pin, "fronts": receivers,
        "master_counted": "as one core: the default workers are powers of two up to cores - 1, "
        "and cores - 1",
        "staleness": "the window's: difference of staleness_total over that of updates_applied",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
        "torch": torch.__version__, "host": platform.node(), "commit": commit()},
        "models": {}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    code = 0
    try:
        with cluster_of(max(workers), pin, cores) as cluster:
            for name in models:
                hidden = MODELS[name]
                model = figures["models"][name] = {
                    "hidden_sizes": hidden, "params": n_params(train_config(hidden_sizes=hidden)),
                    "levels": []}
                for n in workers:
                    say(f"\n== {name} model, {n} worker{'s' * (n > 1)}")
                    level = steady_window(cluster, cluster.workers[:n], hidden, plan, overrides)
                    say(f"  steady: {level['env_steps_per_s']:,.0f} env steps/s, "
                        f"{level['updates_per_s']:,.0f} updates/s, master "
                        f"{fmt(level['master_cpu_cores'], '.2f')} cores, "
                        f"{fmt(level['master_ms_per_push'], '.3f')} ms a push"
                        + (f" ({fmt(level['master_own_ms_per_push'], '.3f')} ms and "
                           f"{fmt(level['master_own_cpu_cores'], '.2f')} cores in its own "
                           "process)" if receivers else ""))
                    model["levels"].append(level)
                    add_efficiency(model["levels"])
                    args.json.write_text(json.dumps(figures, indent=1))
                    level["solve"] = solve(cluster, cluster.workers[:n], hidden, plan, overrides)
                    args.json.write_text(json.dumps(figures, indent=1))
                show(name, model, overrides)
    except KeyboardInterrupt:
        figures["meta"]["interrupted"] = True
        say("\ninterrupted: every process this run started has been ended")
        for name, model in figures["models"].items():
            if model["levels"]:
                show(name, model, overrides)
        code = 130
    args.json.write_text(json.dumps(figures, indent=1))
    say(f"\nfigures written to {args.json}")
    return code
