"""Benchmark: the master's and the learner's CPU per 1,000 env steps of experience pushes (ppo,
impala, apex), what a rollout costs the processes that take it.

    .venv/bin/python scripts/bench.py ingest [--algo impala] [--env MinAtar/Breakout-v1]
        [--pushes 400] [--rounds 3] [--actors 1] [--config '{}'] [--json runs/bench_ingest.json]

One real master (uvicorn) runs the algorithm's preset for the environment (with --config's
overrides) with no worker to start; this process joins as --actors simulated actors, each a worker
on a connection of its own, which push one rollout of the run's shapes (encoded once, before:
frames of random pixels, every step valid) --pushes times between them, each taking the version
its replies name, after a warm-up of three batches. The master's CPU (its process, /proc) over
the pushes and the learner's (its process) until it has taken them all, each divided by the env
steps pushed, and the env steps (transitions) a second the learner took, are a round's figures;
the medians over --rounds are printed. Ape-X's replay alone fills with
`--config '{"learning_starts": 1000000000}'` (no gradient step is taken). The code measured is
whatever `a3c_http` and `master` this process imports; a checkout from before the renames of
55802ce is reached by its old names, so the same measurement runs on both sides of a change.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from a3c_http.config.training import TrainConfig
from scripts.benchlib.report import ROOT, say

try:
    from a3c_http.algos.registry import train_config
except ImportError:  # a checkout from before the algorithms' own config sections (2614e60)
    train_config = TrainConfig
try:
    from a3c_http.algos.registry import model_for
except ImportError:  # a checkout from before the algorithms' own networks
    from a3c_http.models.actor_critic import model_for  # type: ignore[no-redef]
try:
    from a3c_http.algos.learner import expected_tensors
    from a3c_http.algos.registry import algorithm_class
    from a3c_http.local.cluster import ServiceProcess, cpu_seconds, free_port, wait_for
    from a3c_http.wire.named_tensors import encode_tensors

    def _expected(cfg: TrainConfig) -> dict[str, Any]:
        return expected_tensors(cfg, model_for(cfg), algorithm_class(cfg).own_tensors)
except ImportError:  # a checkout from before 55802ce
    from a3c_http.algos.experience import expected_tensors  # type: ignore[no-redef]
    from a3c_http.testing.localcluster import (  # type: ignore[no-redef]
        ServiceProcess,
        cpu_seconds,
        free_port,
        wait_for,
    )  # fmt: skip
    from a3c_http.wire.experience import encode_tensors  # type: ignore[no-redef]

    def _expected(cfg: TrainConfig) -> dict[str, Any]:
        return expected_tensors(cfg, model_for(cfg))  # type: ignore[call-arg]


def rollout_body(cfg: TrainConfig) -> bytes:
    """One rollout of `cfg`'s shapes as a worker's body: random frames, every step valid."""
    generator = torch.Generator().manual_seed(0)
    tensors = {n: torch.zeros(e.shape, dtype=e.dtypes[0]) for n, e in _expected(cfg).items()}
    tensors["valid"][:] = True
    tensors["rewards"][:] = 1.0
    if "stops" in tensors:  # Ape-X's actors' cut: one-step transitions
        tensors["stops"][:] = torch.arange(1, cfg.t_max + 1).unsqueeze(1)
        tensors["discounts"][:] = cfg.gamma
    if "log_probs" in tensors:
        tensors["log_probs"][:] = -1.0
    for name in ("obs", "last_obs"):
        t = tensors[name]
        if t.dtype == torch.bool:
            tensors[name] = torch.rand(t.shape, generator=generator) < 0.1
        elif t.dtype == torch.uint8:
            tensors[name] = torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=generator)
    return encode_tensors(tensors, {"a3c": json.dumps({"episodes": [], "stats": None})})


def one_round(
    algo: str, env_id: str, pushes: int, actors: int = 1, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="a3c-ingest-"))
    env = {"A3C_RUN_DIR": str(folder / "run"), "A3C_WORKERS_FILE": str(folder / "workers.txt")}
    master = ServiceProcess("master.app:app", free_port(), folder / "master.log", env=env)
    master.start().wait_healthy()
    try:
        c = httpx.Client(base_url=master.url, timeout=120)
        r = c.post("/train", json={"workers": [], "seed": 1, "algo": algo, "env_id": env_id,
                                   "master_url": master.url, **(overrides or {})})  # fmt: skip
        r.raise_for_status()
        simulated = [Actor(master.url, c, i) for i in range(actors)]
        cfg = train_config(**c.get("/status").json()["config"])
        body = rollout_body(cfg)

        def learner() -> dict[str, Any]:
            return c.get("/status").json()["learner"]

        wait_for(lambda: learner()["running"], 120, "the learner")
        pid, version = learner()["pid"], c.get("/status").json()["model_version"]
        for actor in simulated:
            actor.version = version
        for _ in range(3 * cfg.queue_size):
            simulated[0].push(body)
        wait_for(lambda: learner()["queued"] == 0, 300, "the warm-up")
        used = learner()["rollouts_used"]
        master0, learner0 = cpu_seconds(master.pid), cpu_seconds(pid)
        started = time.monotonic()
        threads = [
            threading.Thread(target=a.push_many, args=(body, pushes // actors)) for a in simulated
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        master1 = cpu_seconds(master.pid)
        pushed = actors * (pushes // actors)
        wait_for(lambda: learner()["queued"] == 0, 600, "the learner")
        taken_s = time.monotonic() - started
        learner1, used = cpu_seconds(pid), learner()["rollouts_used"] - used
        steps = cfg.t_max * cfg.num_envs / 1000
        return {
            "body_bytes": len(body),
            "master_cpu_per_1k_steps": (master1 - master0) / (pushed * steps),
            "learner_cpu_per_1k_steps": (learner1 - learner0) / (used * steps),
            "transitions_per_s": used * steps * 1000 / taken_s,
            "wall_s": taken_s,
        }
    finally:
        master.stop()


class Actor:
    """One simulated actor: joined as a worker of its own, on a connection of its own, pushing
    the same body with the version each reply names."""

    def __init__(self, url: str, c: httpx.Client, index: int) -> None:
        run = c.post("/join", json={"name": f"bench-{index}", "url": "http://127.0.0.1:9"})
        self.worker_id = run.json()["data"]["run"]["worker_id"]
        self.run_id = run.json()["data"]["run"]["run_id"]
        c.post("/worker_started", json={"worker_id": self.worker_id, "run_id": self.run_id})
        self.client = httpx.Client(base_url=url, timeout=120)
        self.version = 0

    def push(self, body: bytes) -> None:
        headers = {"content-type": "application/octet-stream", "X-Worker-Id": self.worker_id,
                   "X-Model-Version": str(self.version), "X-Run-Id": self.run_id}  # fmt: skip
        reply = self.client.post("/experience", content=body, headers=headers)
        reply.raise_for_status()
        self.version = int(reply.headers["X-Model-Version"])

    def push_many(self, body: bytes, n: int) -> None:
        for _ in range(n):
            self.push(body)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", default="impala", choices=["ppo", "impala", "apex"])
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--pushes", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--actors", type=int, default=1, help="simulated actors pushing at once")
    parser.add_argument("--config", default="{}", help="overrides of the run's config, JSON")
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "bench_ingest.json")
    args = parser.parse_args(argv)
    say(f"code measured: {Path(expected_tensors.__code__.co_filename).resolve().parents[2]}")
    rounds = []
    for i in range(args.rounds):
        rounds.append(
            one_round(args.algo, args.env, args.pushes, args.actors, json.loads(args.config))
        )
        say(f"round {i + 1}: {json.dumps(rounds[-1])}")
    summary = {
        key: statistics.median(r[key] for r in rounds)
        for key in ("master_cpu_per_1k_steps", "learner_cpu_per_1k_steps", "transitions_per_s",
                    "wall_s")  # fmt: skip
    }
    say(f"{args.algo} on {args.env}, medians of {args.rounds}: the master "
        f"{summary['master_cpu_per_1k_steps']:.4f} s and the learner "
        f"{summary['learner_cpu_per_1k_steps']:.4f} s of CPU per 1,000 env steps; "
        f"{summary['transitions_per_s']:,.0f} env steps a second taken by the learner")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rounds": rounds, "medians": summary}, indent=2))
    return 0
