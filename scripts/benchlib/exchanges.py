"""Benchmark: latency of the exchanges a worker makes, against a real master on loopback, next to
the compute they wrap (a rollout and its gradients), with the default network.

    .venv/bin/python scripts/bench.py http [--n 300]

Prints the median and 90th percentile of each, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from a3c_http.algos.a3c.algorithm import rollout_loss
from a3c_http.algos.base import gradients
from a3c_http.algos.registry import model_for, train_config
from a3c_http.envs.rollout import RolloutCollector
from a3c_http.local.cluster import LocalCluster
from a3c_http.net.client import MasterClient
from a3c_http.testing.standin import StandInWorker
from a3c_http.wire import tensors as wire


def timed(fn: Callable[[], object], n: int) -> list[float]:
    """The times of `n` calls of `fn`, in milliseconds."""
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def report(name: str, ms: list[float]) -> None:
    """One line: `name`, the median and the 90th percentile of `ms`."""
    q = statistics.quantiles(ms, n=10)
    print(f"{name:<34} median {statistics.median(ms):7.2f} ms   p90 {q[-1]:7.2f} ms")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="repetitions of each exchange")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    # A day-long heartbeat timeout: the stand-in worker below never heart-beats.
    cfg = train_config(seed=0, max_steps=None, target_return=1e9, heartbeat_timeout_s=86_400)
    with tempfile.TemporaryDirectory(prefix="a3c-bench-") as tmp, StandInWorker() as worker:
        # This process plays the worker; the stand-in only accepts POST /start_worker.
        cluster = LocalCluster(Path(tmp) / "run", Path(tmp) / "logs", workers=[])
        try:
            cluster.start()
            body = {**cfg.model_dump(), "workers": [worker.url]}
            reply = cluster.http.post(f"{cluster.master.url}/train", json=body)
            reply.raise_for_status()
            run_id = reply.json()["data"]["run_id"]
            model = model_for(cfg)
            spec = wire.spec_of(model)
            collector = RolloutCollector(cfg.env_id, cfg.env_kwargs, cfg.num_envs, 0)
            rollout = collector.collect(model, cfg.t_max)

            def learn() -> dict[str, torch.Tensor]:
                loss = rollout_loss(model, rollout, cfg).total
                return gradients(model, loss, cfg.max_grad_norm)[0]

            grads = learn()
            print(
                f"model: {sum(p.numel() for p in model.parameters()):,} parameters, "
                f"{len(wire.encode(grads)):,} bytes on the wire; rollout of "
                f"{cfg.t_max} x {cfg.num_envs} steps"
            )
            report("rollout (compute)", timed(lambda: collector.collect(model, cfg.t_max), args.n))
            report("loss + gradients (compute)", timed(learn, args.n))
            report(
                "encode + decode (safetensors)",
                timed(lambda: wire.decode(wire.encode(grads), spec), args.n),
            )
            with MasterClient(cluster.master.url, run_id=run_id) as client:
                client.worker_started("bench", None)  # only registered workers take part
                report("GET /healthz", timed(client.healthz, args.n))
                report("POST /episode", timed(lambda: client.episode("bench", 10.0, 10), args.n))
                report("GET /global_model_weights", timed(lambda: client.get_weights(spec), args.n))
                version = [client.get_weights(spec).version]

                def push() -> None:
                    version[0] = client.push_gradients("bench", version[0], grads, spec).version

                report("POST /gradients (round trip)", timed(push, args.n))
            collector.close()
        finally:
            cluster.close()
    return 0
