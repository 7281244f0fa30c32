"""Benchmark: how many actors one core of the master (and of the learner) serves, by algorithm and
model, beside the physical limits measured in the same run, and what the seeds' own setups need.

    .venv/bin/python scripts/bench.py capacity [--algos a3c,ppo,impala,apex]
        [--models default,minatar,1M,atari] [--actors 64] [--seconds 10] [--actor-seconds 5]
        [--shards N] [--json runs/bench_capacity.json]

For each algorithm and model, in turn (never two at once):

- `bench.py load`'s run (scripts/benchlib/actors.py): --actors simulated actors push ready-made
  bodies at a fresh master for --seconds; the master's CPU a push (its process and receivers'),
  the learner's for an algorithm that has one, and the physical limits of a push of the model
  (a copy of its vector, one optimizer step, the bytes each way);
- one real actor of the same config, played in this process for --actor-seconds on one thread:
  its environments, its policy, its algorithm's side of each rollout (A3C's gradients, Ape-X's
  initial priorities), each push handed to a port that keeps it (no encoding, no network: the
  worker's push process does that on its own core). Its pushes a second are what one actor asks.

A core of the master serves `1000 / (its ms a push) / (one actor's pushes a second)` actors, and a
core of the learner likewise, and with `--shards N` (the a3c and dqn rows; every push crosses every
shard) a core of each shard, which spends its share of the shards' CPU a push: upper bounds, since
one master process takes one core at most (receivers and learners take others), and real pushes
arrive one at a time, which costs the master more than back-to-back ones do (docs/performance.md,
Capacity). The seeds' setups follow: Gorila's 100 bundles of an actor and a learner, which push
gradients (`a3c`'s rows), and Ape-X's 360 actors (`apex`'s rows), in cores of the master and of the
learner, and in 16-core hosts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

from a3c_http.algos.exploration import derive
from a3c_http.algos.registry import algorithm_class, algorithm_for, model_for
from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import MissingDependency, register_family
from a3c_http.envs.rollout import RolloutCollector
from scripts.benchlib.actors import ALGOS, RunRefused, load, start
from scripts.benchlib.options import number
from scripts.benchlib.procs import end_on_signals
from scripts.benchlib.report import ROOT, say
from scripts.benchlib.server import standin_master

# The model sizes of the capacity table: the config fields (over the env's preset) of each.
MODELS: dict[str, dict[str, Any]] = {
    "default": {"env_id": "CartPole-v1"},
    "minatar": {"env_id": "MinAtar/Breakout-v1"},  # the small CNN (the minatar extra)
    "1M": {"env_id": "CartPole-v1", "hidden_sizes": [700, 700]},
    "atari": {"env_id": "ALE/Pong-v5"},  # the Nature CNN (the atari extra)
}
# The seeds' setups: how many actors, and the algorithm whose rows they take.
SETUPS = {"Gorila's 100 bundles": (100, "a3c"), "Ape-X's 360 actors": (360, "apex")}
HOST_CORES = 16
# The algorithms whose runs take `shards` (a3c_http/algos/sharded.py).
SHARDED = ("a3c", "dqn")


class KeepingPort:
    """A worker's port (a3c_http/algos/base.py `WorkerPort`) that takes each push and keeps
    nothing: what an actor costs by itself."""

    version = 0

    def __init__(self) -> None:
        self.pushes = 0

    def push_gradients(self, update: Any, rollout: Any, wait_s: float) -> None:
        self.pushes += 1

    def push_experience(self, rollout: Any) -> None:
        self.pushes += 1

    def report_episodes(self, episodes: list) -> bool:
        return False

    def push_weights(self, temporary: bool) -> None:
        self.pushes += 1

    def pull_weights(self) -> None:
        pass

    def target_weights(self, if_not_version: int | None) -> None:
        return None

    def learning(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def note_metrics(self, metrics: dict[str, float]) -> None:
        pass


def actor_rate(config: TrainConfig, seconds: float) -> dict[str, float]:
    """One actor of `config` played here on one thread for `seconds`: its env steps and pushes a
    second."""
    import torch

    torch.set_num_threads(1)  # as a worker (A3C_TORCH_THREADS)
    config = derive(config, 0, algorithm_class(config)).config_for(config)  # the first worker's
    model = model_for(config)
    algorithm = algorithm_for(config, model, model)
    collector = RolloutCollector.for_config(config, 0)
    port, steps = KeepingPort(), 0
    try:
        started = time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds or not port.pushes:
            rollout = collector.collect(
                algorithm.policy, config.t_max, 0, algorithm.bootstraps_on_worker
            )
            steps += rollout.num_steps
            algorithm.on_rollout(port, rollout)
    finally:
        collector.close()
    return {"env_steps_per_s": round(steps / elapsed, 1),
            "pushes_per_s": round(port.pushes / elapsed, 2)}


def served_per_core(ms_a_push: float | None, actor_pushes_per_s: float) -> float | None:
    """The actors one core serves, where a push costs it `ms_a_push` and an actor makes
    `actor_pushes_per_s`."""
    if not ms_a_push or not actor_pushes_per_s:
        return None
    return 1000.0 / ms_a_push / actor_pushes_per_s


def row(algo: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """One row of the table: the load on a fresh master, and one actor's rate."""
    fields = {"algo": algo, **MODELS[model]}
    if args.shards > 1 and algo in SHARDED:
        fields["shards"] = args.shards
    with standin_master(args.receivers) as (cluster, worker):
        run_id, config = start(cluster, worker.url, fields)
        measured = load(cluster, run_id, config, args, None)
    actor = actor_rate(config, args.actor_seconds)
    cpu = measured["cpu_ms_per_push"]
    master_ms = (cpu.get("master") or 0) + (cpu.get("receivers") or 0)
    shards = fields.get("shards", 1)
    shard_ms = cpu["shards"] / shards if cpu.get("shards") else None  # each shard's share
    return {
        "shards": shards, "shard_ms_per_push": shard_ms,
        "actors_per_shard_core": served_per_core(shard_ms, actor["pushes_per_s"]),
        "algo": algo, "model": model, "config": fields, "actor": actor,
        "master_ms_per_push": round(master_ms, 4), "learner_ms_per_push": cpu.get("learner"),
        "actors_per_master_core": served_per_core(master_ms, actor["pushes_per_s"]),
        "actors_per_learner_core": served_per_core(cpu.get("learner"), actor["pushes_per_s"]),
        "pushes_per_s": measured["pushes_per_s"], "p99_ms": measured["p99_ms"],
        "limits": measured["limits"], "5xx": measured["5xx"], "mismatches": measured["mismatches"],
    }


def setups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each of the seeds' setups needs, by model, from the rows of its algorithm."""
    out = []
    for name, (actors, algo) in SETUPS.items():
        for r in (r for r in rows if r["algo"] == algo):
            cores = {
                role: math.ceil(actors / r[f"actors_per_{role}_core"])
                for role in ("master", "learner", "shard")
                if r.get(f"actors_per_{role}_core") is not None
            }
            if "shard" in cores:  # each shard a core, and every one serves every push
                cores["shard"] = r["shards"] * cores["shard"]
            total = actors + sum(cores.values())  # one core an actor, as the seeds run them
            out.append({"setup": name, "model": r["model"], "cores": cores,
                        "actor_cores": actors, "hosts": math.ceil(total / HOST_CORES)})
    return out


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", default="a3c,ppo,impala,apex")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--actors", type=number(int, 1), default=64,
                        help="simulated actors of each load")
    parser.add_argument("--seconds", type=number(float, 0, more=True), default=10.0,
                        help="each load's window")
    parser.add_argument("--warmup", type=number(float, 0), default=2.0)
    parser.add_argument("--actor-seconds", type=number(float, 0, more=True), default=5.0)
    parser.add_argument("--receivers", type=number(int, 0), default=0)
    parser.add_argument("--shards", type=number(int, 1), default=1,
                        help="parameter-server shards of the a3c and dqn rows (1: none)")
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "bench_capacity.json")
    args = parser.parse_args(argv)
    for option, given, known in (("--models", args.models, MODELS), ("--algos", args.algos, ALGOS)):
        unknown = [v for v in given.split(",") if v not in known]
        if unknown:
            parser.error(f"{option}: {', '.join(unknown)} unknown; of {', '.join(known)}")
    end_on_signals()  # Ctrl-C or SIGTERM: each master's `finally` ends it and its children
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"actors": args.actors, "seconds": args.seconds, "rows": rows}
    for model in args.models.split(","):
        try:  # MinAtar and Atari need their extras (./scripts/setup_venv.sh bench, atari)
            register_family(str(MODELS[model]["env_id"]))
        except MissingDependency as exc:
            say(f"{model}: skipped ({exc})")
            continue
        for algo in args.algos.split(","):
            say(f"== {algo}, {model} model")
            try:
                rows.append(row(algo, model, args))
            except RunRefused as exc:  # an algorithm that cannot run this env (apex on Box)
                say(f"  skipped: {exc}")
                continue
            r = rows[-1]
            say(f"  master {r['master_ms_per_push']} ms a push, learner "
                f"{r['learner_ms_per_push']} ms; one actor {r['actor']['env_steps_per_s']:,} env "
                f"steps/s, {r['actor']['pushes_per_s']} pushes/s: "
                f"{_shown(r['actors_per_master_core'])} actors a master core, "
                f"{_shown(r['actors_per_learner_core'])} a learner core"
                + (f", {_shown(r['actors_per_shard_core'])} a core of each of its {r['shards']} "
                   f"shards ({r['shard_ms_per_push']:.3g} ms a push each)"
                   if r["actors_per_shard_core"] else ""))
            out["setups"] = setups(rows)
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=2))
    for s in out.get("setups", []):
        say(f"{s['setup']}, {s['model']} model: {s['actor_cores']} actor cores, "
            f"{json.dumps(s['cores'])} cores for the master and learner: {s['hosts']} hosts of "
            f"{HOST_CORES} cores")
    return 1 if any(r["mismatches"] or r["5xx"] for r in rows) else 0

