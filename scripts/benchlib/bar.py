"""Benchmark: every figure of the cluster's performance bar in one run, one section after another
(never two at once: a 2-core machine would measure their contention).

    .venv/bin/python scripts/bench.py [--sections throughput,master,latency,wire,solve]
        [--quick] [--seeds 3] [--budget 150000] [--rounds 3] [--json runs/bench.json]

- throughput: env steps/s of (a) the learner in one process without HTTP, (b) the cluster with
  one worker, (c) with two, in the steady state of a budget of env steps, the three in turn
  `--rounds` times; the medians, the ratios to (a) within each round and their median, and the
  workers' share of time in HTTP (cluster.py);
- master: gradient pushes/s and latency with 1, 4, 16 and 64 simulated workers pushing
  ready-made gradients over keep-alive connections, for the default model and one of about a
  million parameters (the latter also with `wire_dtype` bfloat16); errors, and updates lost
  (200 replies against `updates_applied`)
  (server.py, load.py);
- latency: env steps/s of the 2-worker cluster with its workers behind a loopback proxy that
  delays each direction by 0, 1, 5 and 20 ms (a3c_http/testing/delayproxy.py), and the time to solve
  CartPole-v1 at 5 ms;
- wire: bytes of one gradient exchange on the wire against the raw float32 size of the
  parameters, and the encode and decode times, with tensors as float32 and as bfloat16
  (`wire_dtype`);
- solve: wall time to CartPole-v1's target of the default cluster (`scripts/bench.py solve`'s
  runs) and of SB3's A2C with the RL Zoo's settings (`scripts/bench.py learn`'s), alternating,
  seed by seed.

Prints a table per section and, at the end, the bar: each goal, its measured figure, met or NOT
met. Every figure goes to the JSON file, rewritten after each section. `--quick` gives every
section a tiny budget (seconds each), only to check that the script works. Ctrl-C or SIGTERM ends
every process it started (by pid) and exits with what was measured so far.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from scripts.benchlib import cluster, server
from scripts.benchlib.cluster import fresh_run
from scripts.benchlib.procs import end_on_signals
from scripts.benchlib.report import ROOT, commit, fmt, say, table, ticker
from scripts.benchlib.sb3 import run_sb3
from scripts.benchlib.tasks import TASKS

SECTIONS = ("throughput", "master", "latency", "wire", "solve")
LEVELS = [1, 4, 16, 64]
DELAYS_MS = [0.0, 1.0, 5.0, 20.0]
CARTPOLE = TASKS["CartPole-v1"]  # its target, budget and cap, as learn.py has them
TARGET = CARTPOLE.target


@dataclass(frozen=True)
class Plan:
    budget: int  # env steps of each throughput and latency run
    cap_s: float  # ... or this many seconds
    warmup_s: float  # per master level, unmeasured
    window_s: float  # per master level, measured
    max_count: int  # per master level, replies at most
    reps: int  # wire encode / decode repetitions
    solve_cap_s: float  # seconds before a run to the target gives up
    seeds: int
    receivers: int = 0  # the master section's master has this many receivers (A3C_RECEIVERS)
    rounds: int = 1  # throughput: (a), (b) and (c) in turn, this many times; medians

    @classmethod
    def of(cls, args: argparse.Namespace) -> Plan:
        if args.quick:
            return cls(
                args.budget or 6_000, 30.0, 0.3, 1.0, 20_000, 20, 8.0, args.seeds or 1,
                args.receivers, args.rounds or 1,
            )
        # 150,000 env steps: windows of about 15 s; at 60,000 (6 s) the same code's latency row
        # read 0.64, 1.08 and 0.73 on this noisy 2-core machine.
        return cls(
            args.budget or 150_000, 300.0, 1.0, 5.0, 50_000, 200, 600.0, args.seeds or 3,
            args.receivers, args.rounds or 3,
        )


# -- the solve section --------------------------------------------------------------------------


def solve(seeds: int, cap_s: float) -> dict:
    try:
        import stable_baselines3  # noqa: F401
        have_sb3 = True
    except ImportError:
        have_sb3 = False
        say("  stable-baselines3 is not installed: the SB3 half is skipped "
            "(install it with ./scripts/setup_venv.sh bench)")
    runs = []
    for seed in range(seeds):
        for learner in ("cluster", "sb3") if have_sb3 else ("cluster",):
            with ticker(f"{learner} seed {seed}"):
                r = (fresh_run(seed, 2, {}, cap_s) if learner == "cluster"
                     else run_sb3("CartPole-v1", seed, CARTPOLE, cap_s))
            runs.append({"learner": learner, "seed": seed, "solved": r["solved"],
                         "seconds": round(r["seconds"], 3), "env_steps": r["env_steps"],
                         "mean_return_100": r["mean_return_100"]})
            say(f"  {learner:<7} seed {seed}: {'solved' if r['solved'] else 'NOT solved'} in "
                f"{r['seconds']:.1f} s, {r['env_steps']:,} env steps")
    out: dict = {"target": TARGET, "cap_s": cap_s, "sb3_installed": have_sb3, "runs": runs}
    for learner in ("cluster", "sb3"):
        mine = [r for r in runs if r["learner"] == learner]
        if mine:
            out[learner] = {"median_s": statistics.median(r["seconds"] for r in mine),
                            "solved": sum(r["solved"] for r in mine), "runs": len(mine)}
    if "cluster" in out and "sb3" in out:
        out["ratio"] = round(out["cluster"]["median_s"] / out["sb3"]["median_s"], 4)
    return out


RUNNERS: dict[str, Callable[[Plan], dict]] = {
    "throughput": lambda p: cluster.throughput(p.budget, p.cap_s, p.rounds),
    "master": lambda p: server.master(
        LEVELS, p.warmup_s, p.window_s, p.max_count, p.receivers
    ),
    "latency": lambda p: cluster.latency(p.budget, p.cap_s, DELAYS_MS, p.solve_cap_s),
    "wire": lambda p: server.wire_figures(p.reps),
    "solve": lambda p: solve(p.seeds, p.solve_cap_s),
}


# -- tables -------------------------------------------------------------------------------------


def show_throughput(f: dict) -> None:
    names = {"learner": "(a) learner, no HTTP", "cluster_1": "(b) cluster, 1 worker",
             "cluster_2": "(c) cluster, 2 workers"}
    rows = []
    for key, name in names.items():
        r = f[key]
        rows.append([name, fmt(r["steps_per_s"]), fmt(r.get("ratio", 1.0), ".2f"),
                     fmt(r["steady"]), fmt(r.get("http_share"), ".0%")])
    rounds = f.get("rounds", 1)
    each = f", medians of {rounds} alternated rounds" if rounds > 1 else ""
    table(f"throughput ({f['budget']:,} env steps a run{each})",
          ["run", "env steps/s", "vs (a)", "steady", "HTTP share"], rows)
    if rounds > 1:
        say("  (b) / (a) in each round: "
            + ", ".join(fmt(x, ".2f") for x in f["cluster_1"]["ratios"]))


def show_master(f: dict) -> None:
    receivers = f.get("fronts") or 0  # then also the master's own process's CPU a push
    for name, m in f["models"].items():
        rows = [[str(r["workers"]), fmt(r["pushes_per_s"]), fmt(r["p50_ms"], ".2f"),
                 fmt(r["p99_ms"], ".2f"), fmt(r["max_ms"], ".1f"),
                 ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0",
                 fmt(r["applied"]), str(r["lost"]), fmt(r.get("master_ms_per_push"), ".3f"),
                 *([fmt(r.get("master_own_ms_per_push"), ".3f")] if receivers else []),
                 fmt(r.get("master_cpu"), ".0%"), fmt(r["client_cpu"], ".0%")]
                for r in m["levels"]]
        table(f"master, {name} model ({m['params']:,} parameters, "
              f"{m.get('wire_dtype', 'float32')}); max_staleness "
              f"{f['max_staleness']:,}: n pushers at once are up to n - 1 versions stale by "
              "construction"
              + (f"; {receivers} receivers, in the master's CPU" if receivers else ""),
              ["workers", "pushes/s", "p50 ms", "p99 ms", "max ms", "errors", "applied", "lost",
               "master ms/push", *(["own process ms/push"] if receivers else []), "master CPU",
               "client CPU"], rows)


def show_latency(f: dict) -> None:
    rows = [[f"{r['delay_ms']:g} ms", fmt(r["steps_per_s"]), fmt(r["ratio"], ".2f"),
             fmt(r["steady"]), fmt(r["http_share"], ".0%")] for r in f["levels"]]
    table(f"latency: 2-worker cluster, workers behind a delay each way ({f['budget']:,} env "
          "steps a run)", ["delay", "env steps/s", "vs 0 ms", "steady", "HTTP share"], rows)
    s = f["solve_5ms"]
    say(f"  CartPole-v1 at 5 ms each way: {'solved' if s['solved'] else 'NOT solved'} in "
        f"{s['seconds']:.1f} s, {s['env_steps']:,} env steps")


def show_wire(f: dict) -> None:
    rows = [[name, fmt(m["params"]), fmt(m["raw_bytes"]),
             f"{m['request_bytes']:,} ({m['request_ratio']:.3f})",
             f"{m['reply_bytes']:,} ({m['reply_ratio']:.3f})",
             fmt(m["encode_ms"], ".3f"), fmt(m["decode_ms"], ".3f")]
            for name, m in f["models"].items()]
    table("wire: one gradient exchange, HTTP headers included (ratio to the raw float32 size; "
          "bf16: wire_dtype bfloat16)",
          ["model", "params", "raw bytes", "request bytes", "reply bytes", "encode ms",
           "decode ms"], rows)


def show_solve(f: dict) -> None:
    rows = [[name, f"{f[name]['solved']}/{f[name]['runs']}", fmt(f[name]["median_s"], ".1f")]
            for name in ("cluster", "sb3") if name in f]
    table(f"solve: CartPole-v1 to {f['target']:g}", ["learner", "solved", "median s"], rows)
    say(f"  ratio cluster / SB3: {fmt(f.get('ratio'), '.2f')}")
    if "sb3" in f and f["sb3"]["solved"] < f["sb3"]["runs"]:
        say(f"  (SB3 solved {f['sb3']['solved']}/{f['sb3']['runs']}: its median counts the "
            f"runs that did not solve at the cap, {f['cap_s']:g} s)")


SHOW = {"throughput": show_throughput, "master": show_master, "latency": show_latency,
        "wire": show_wire, "solve": show_solve}

# -- the bar ------------------------------------------------------------------------------------


def _levels(f: dict, model: str) -> list[dict]:
    return f.get("master", {}).get("models", {}).get(model, {}).get("levels", [])


def _level(f: dict, model: str, workers: int) -> dict | None:
    return next((r for r in _levels(f, model) if r["workers"] == workers), None)


def bar(f: dict) -> list[dict]:
    """Each goal of the bar: what was measured, and met (True / False; None: not measured)."""
    goals = []

    def goal(text: str, measured: str | None, met: bool | None) -> None:
        goals.append({"goal": text, "measured": measured or "not measured", "met": met})

    s = f.get("solve", {})
    if "ratio" in s:
        every = s["cluster"]["solved"] == s["cluster"]["runs"]
        goal("solve: cluster / SB3 median wall time <= 1.0, solved in every seed",
             f"{s['ratio']:.2f}, {s['cluster']['solved']}/{s['cluster']['runs']} solved",
             s["ratio"] <= 1.0 and every)
    else:
        goal("solve: cluster / SB3 median wall time <= 1.0, solved in every seed", None, None)
    ratio = f.get("throughput", {}).get("cluster_1", {}).get("ratio")
    goal("throughput: (b) cluster with 1 worker / (a) learner >= 0.9",
         fmt(ratio, ".2f") if ratio else None, None if ratio is None else ratio >= 0.9)
    r16 = _level(f, "default", 16)
    goal("master, default model, 16 workers: >= 3,000 pushes/s, p99 < 25 ms",
         r16 and f"{fmt(r16['pushes_per_s'])}/s, p99 {fmt(r16['p99_ms'], '.1f')} ms",
         None if r16 is None else bool(r16["pushes_per_s"]) and r16["pushes_per_s"] >= 3000
         and r16["p99_ms"] is not None and r16["p99_ms"] < 25)
    for model, most in (("default", 0.4), ("1M", 4.0)):
        costs = [r["master_ms_per_push"] for r in _levels(f, model)
                 if r.get("master_ms_per_push") is not None]
        goal(f"master, {model} model: CPU per push <= {most:g} ms (its least over the levels)",
             costs and f"{min(costs):.3f} ms", None if not costs else min(costs) <= most)
    rates = [r["pushes_per_s"] or 0 for r in _levels(f, "1M")]
    goal("master, 1M model: >= 250 pushes/s (its most over the levels)",
         rates and f"{fmt(max(rates))}/s", None if not rates else max(rates) >= 250)
    r64 = _level(f, "default", 64)
    goal("master, default model, 64 workers: no errors, nothing lost",
         r64 and f"{sum(r64['errors'].values())} errors, {r64['lost']} lost",
         None if r64 is None else not r64["errors"] and r64["lost"] == 0)
    # The goal is the encoding's overhead over the raw float32 size: the float32 rows.
    w = {n: m for n, m in f.get("wire", {}).get("models", {}).items()
         if m.get("wire_dtype", "float32") == "float32"}
    worst = max((max(m["request_ratio"], m["reply_ratio"]) for m in w.values()), default=None)
    goal("wire: bytes per exchange / raw size <= 1.05 (request / reply)",
         ", ".join(f"{n} {m['request_ratio']:.3f} / {m['reply_ratio']:.3f}"
                   for n, m in w.items()) or None, None if worst is None else worst <= 1.05)
    lat = f.get("latency", {})
    r20 = next((r for r in lat.get("levels", []) if r["delay_ms"] == 20), None)
    goal("latency: 20 ms each way >= 0.8 of the undelayed env steps/s",
         r20 and fmt(r20["ratio"], ".2f"), None if r20 is None or r20["ratio"] is None
         else r20["ratio"] >= 0.8)
    s5 = lat.get("solve_5ms")
    goal("latency: CartPole-v1 solved at 5 ms each way",
         s5 and f"{'solved' if s5['solved'] else 'NOT solved'} in {s5['seconds']:.0f} s",
         None if s5 is None else s5["solved"])
    return goals


def show_bar(goals: list[dict]) -> None:
    verdict = {True: "met", False: "NOT met", None: "-"}
    table("the bar", ["goal", "measured", "result"],
          [[g["goal"], g["measured"], verdict[g["met"]]] for g in goals])


# -- the command --------------------------------------------------------------------------------


def main(argv: list[str] | None = None, prog: str | None = None, epilog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                     epilog=epilog)
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, run in the order given; of {', '.join(SECTIONS)}")
    parser.add_argument("--quick", action="store_true",
                        help="tiny budgets, only to check that the script works")
    parser.add_argument("--seeds", type=int, default=None, help="solve: seeds (3; --quick 1)")
    parser.add_argument("--budget", type=int, default=None,
                        help="env steps of each throughput and latency run "
                        "(150,000; --quick 6,000)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="throughput: (a), (b) and (c) in turn this many times, medians "
                        "(3; --quick 1)")
    parser.add_argument("--receivers", "--fronts", type=int, default=0,  # and its old name
                        help="master: give the master this many receivers (A3C_RECEIVERS) and push "
                        "through them (0)")
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "bench.json",
                        help="where the figures go (default runs/bench.json)")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        parser.error(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")
    plan = Plan.of(args)
    end_on_signals()
    torch.set_num_threads(1)  # as each worker (A3C_TORCH_THREADS): the same compute per step
    figures: dict = {"meta": {"argv": argv, "plan": asdict(plan), "sections": sections,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                              "python": platform.python_version(), "torch": torch.__version__,
                              "host": platform.node(), "cpus": os.cpu_count(),
                              "commit": commit()}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    code = 0
    try:
        for name in sections:
            say(f"\n== {name}")
            started = time.monotonic()
            figures[name] = RUNNERS[name](plan)
            figures[name]["section_s"] = round(time.monotonic() - started, 1)
            SHOW[name](figures[name])
            args.json.write_text(json.dumps(figures, indent=1))
    except KeyboardInterrupt:
        figures["meta"]["interrupted"] = True
        say("\ninterrupted: every process this run started has been ended")
        code = 130
    figures["bar"] = bar(figures)
    show_bar(figures["bar"])
    args.json.write_text(json.dumps(figures, indent=1))
    say(f"\nfigures written to {args.json}")
    return code
