"""The parameter server alone, for the bar (`scripts/bench.py`): how many gradient pushes a
master takes (`master`) and how many bytes one exchange puts on the wire (`wire`), for the
default model and one of about a million parameters, with tensors on the wire as float32 and
(`wire_dtype`) as bfloat16.

The master is a real uvicorn process whose run has no real worker (as `scripts/bench.py http`
has it): a StandInWorker accepts `POST /start_worker` and never trains, and this process plays
the workers. The run never ends by itself: no step budget, a day-long heartbeat timeout.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from a3c_http.algos.a3c.algorithm import rollout_loss
from a3c_http.algos.base import gradients
from a3c_http.algos.registry import model_for, train_config
from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import MissingDependency, register_family
from a3c_http.envs.rollout import RolloutCollector
from a3c_http.local.cluster import LocalCluster, cpu_delta, free_port
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.net import tls
from a3c_http.net.client import MasterClient
from a3c_http.testing.delayproxy import DelayProxy
from a3c_http.testing.standin import StandInWorker
from a3c_http.wire import tensors as wire
from scripts.benchlib.cluster import UNREACHABLE
from scripts.benchlib.load import push_level, ready_bodies
from scripts.benchlib.report import say

# The models measured: CartPole-v1's default, and hidden layers of 700 (990,503 parameters).
MODELS = {"default": [64, 64], "1M": [700, 700]}
# What a row's name adds for each wire_dtype (float32 rows keep the model's name alone).
DTYPES = {"float32": "", "bfloat16": " bf16"}
# The master section: the wire_dtype matters for the large model (half its bytes a push); the
# Nature CNN of ALE/Pong-v5's preset (1,687,719 parameters, the atari extra) as that preset
# sends it, in bfloat16. name -> (hidden_sizes, wire_dtype, other config fields).
MASTER_RUNS: dict[str, tuple[list[int], str, dict]] = {
    "default": ([64, 64], "float32", {}), "1M": ([700, 700], "float32", {}),
    "1M bf16": ([700, 700], "bfloat16", {}),
    "Pong CNN bf16": ([], "bfloat16", {"env_id": "ALE/Pong-v5"}),
}
# With n pushers at once each push is up to n - 1 versions stale by construction: none refused.
MAX_STALENESS = 1_000_000


@contextlib.contextmanager
def standin_master(
    receivers: int = 0, env: dict[str, str] | None = None
) -> Iterator[tuple[LocalCluster, StandInWorker]]:
    """A master process (with `receivers` receivers, master/ingress/receivers.py; `env`: more of
    its environment, e.g. A3C_TLS_*) and no worker process; the stand-in is the run's only worker
    host (over TLS where `env` configures it)."""
    env = dict(env or {})
    if receivers:
        env.update(A3C_RECEIVERS=str(receivers), A3C_RECEIVERS_BIND=f"127.0.0.1:{free_port()}")
    with (
        tempfile.TemporaryDirectory(prefix="a3c-bench-") as tmp,
        StandInWorker(tls=tls.from_environ(env)) as worker,
    ):
        cluster = LocalCluster(Path(tmp) / "run", Path(tmp) / "logs", workers=[], env=env)
        try:
            say("  starting a master (its workers are played by this process)")
            cluster.start()
            yield cluster, worker
        finally:
            cluster.close()


def start_run(
    cluster: LocalCluster, worker: StandInWorker, hidden_sizes: list[int],
    wire_dtype: str = "float32", **extra: object,
) -> tuple[str, TrainConfig]:
    """End the master's run, if any, and start one of a model with `hidden_sizes` whose tensors
    travel as `wire_dtype` (`extra`: other config fields, e.g. another env_id)."""
    # A plain POST /stop: there is no worker process to wait for (LocalCluster.stop_run would).
    cluster.http.post(f"{cluster.master.url}/stop", json={}).raise_for_status()
    fields = {"seed": 0, "max_steps": None, "target_return": UNREACHABLE,
              "heartbeat_timeout_s": 86_400, "max_staleness": MAX_STALENESS,
              "hidden_sizes": hidden_sizes, "wire_dtype": wire_dtype, **extra}
    reply = cluster.train(**fields, workers=[worker.url])
    reply.raise_for_status()
    return reply.json()["data"]["run_id"], train_config(**fields)


def ms_a_push(cpu_s: float | None, pushes: int, digits: int = 3) -> float | None:
    """CPU seconds spent over `pushes` pushes handled, in ms a push; None without either."""
    return round(cpu_s * 1000 / pushes, digits) if cpu_s is not None and pushes else None


def n_params(config: TrainConfig) -> int:
    return sum(p.numel() for p in model_for(config).parameters())


def master(
    levels: list[int], warmup_s: float, window_s: float, max_count: int, receivers: int = 0
) -> dict:
    """Per model (and wire_dtype) and number of simulated workers: pushes/s, latency and errors
    (load.py), `lost`: 200 replies the master's `updates_applied` did not count (or,
    below 0, counted without a 200), and the master's CPU. With `receivers`, the simulated workers
    push to the master's receivers, whose CPU counts as the master's."""
    out: dict = {"max_staleness": MAX_STALENESS, "warmup_s": warmup_s, "window_s": window_s,
                 "max_count": max_count, "fronts": receivers, "models": {}}
    with standin_master(receivers) as (cluster, worker):
        host = cluster.master.host
        port = cluster.status()["fronts"]["port"] if receivers else cluster.master.port
        for name, (hidden, dtype, extra) in MASTER_RUNS.items():
            try:  # the Atari model needs the atari extra (./scripts/setup_venv.sh atari)
                register_family(str(extra.get("env_id", "CartPole-v1")))
            except MissingDependency as exc:
                say(f"  {name} model: skipped ({exc})")
                continue
            run_id, config = start_run(cluster, worker, hidden, dtype, **extra)
            bodies = ready_bodies(wire.Layout.of(model_for(config), dtype))
            count = n_params(config)
            tag = name.replace(" ", "-")  # worker ids take no spaces
            say(f"  {name} model, hidden {hidden}, {dtype}: {count:,} parameters, "
                f"{len(bodies[0].data):,} bytes a push")
            rows = []
            for n in levels:
                before, cpu = cluster.status(), cluster.master.cpu_seconds()  # receivers too
                own = {pid: t for pid, t in cpu.items() if pid == cluster.master.pid}
                level = push_level(host, port, n, bodies, run_id, before["model_version"],
                                   warmup_s, window_s, max_count, tag=f"sim-{tag}-{n}",
                                   master_port=cluster.master.port)
                after, now = cluster.status(), cluster.master.cpu_seconds()
                cpu, own_cpu = cpu_delta(cpu, now), cpu_delta(own, now)
                applied = after["updates_applied"] - before["updates_applied"]
                rejected = after["updates_rejected"] - before["updates_rejected"]
                row = {**level.summary(), "applied": applied, "lost": level.ok - applied,
                       "rejected": rejected,
                       # The master's CPU over the whole level, warm-up included, per push it
                       # answered (applied or refused), and in cores over the level's time.
                       "master_ms_per_push": ms_a_push(cpu, applied + rejected),
                       "master_cpu": round(cpu / level.wall_s, 3) if cpu is not None else None,
                       # With receivers: the master's own process alone, what caps its pushes/s.
                       "master_own_ms_per_push": (
                           ms_a_push(own_cpu, applied + rejected) if receivers else None)}
                rows.append(row)
                say(f"    {n:>3} workers: {row['pushes_per_s'] or 0:,.0f} pushes/s, p50 "
                    f"{row['p50_ms']} ms, p99 {row['p99_ms']} ms, master "
                    f"{row['master_ms_per_push']} ms CPU a push"
                    + (f" ({row['master_own_ms_per_push']} in its own process)" if receivers else
                    "") + f", errors {row['errors'] or 0}")
            out["models"][name] = {"hidden_sizes": hidden, "wire_dtype": dtype, "params": count,
                                   "levels": rows}
    return out


def real_gradients(model: ActorCritic, config: TrainConfig) -> tuple[dict, float, float]:
    """The gradients of one rollout of `model`, as a worker sends them, with the loss and the
    norm before clipping it reports."""
    collector = RolloutCollector(config.env_id, config.env_kwargs, config.num_envs, 0)
    try:
        rollout = collector.collect(model, config.t_max)
    finally:
        collector.close()
    loss = rollout_loss(model, rollout, config).total
    grads, norm = gradients(model, loss, config.max_grad_norm)
    return grads, float(loss.detach()), float(norm)


def median_ms(reps: int, fn: Callable[..., object], *args: object) -> float:
    """The median time of `fn(*args)` over `reps` calls, in milliseconds."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 4)


def wire_figures(reps: int) -> dict:
    """Per model and wire_dtype: the raw float32 size of its state_dict, the bytes of one
    gradient exchange as a worker makes it (MasterClient.push_gradients, with a rollout's
    episodes and statistics in the body's metadata) counted on the wire by DelayProxy (delay 0),
    each way, HTTP headers included, and the median times to encode a gradient body and decode
    one."""
    out: dict = {"reps": reps, "models": {}}
    with standin_master() as (cluster, worker), DelayProxy(cluster.master.port, 0) as proxy:
        for (model_name, hidden), (dtype, suffix) in itertools.product(
            MODELS.items(), DTYPES.items()
        ):
            name = model_name + suffix
            run_id, config = start_run(cluster, worker, hidden, dtype)
            model = model_for(config)
            layout = wire.Layout.of(model, dtype)
            raw = 4 * layout.numel
            grads, loss, norm = real_gradients(model, config)
            # What a CartPole worker's push carries besides the gradients: an episode or two and
            # its statistics.
            report = {
                "episodes": [[23.0, 23]],
                "stats": {"episodes": 41, "steps": 1017, "env_steps": 1240,
                          "steps_per_s": 4123.4, "last_reward": 23.0,
                          "metrics": {"train/policy_loss": -0.0123, "train/value_loss": 0.234,
                                      "train/entropy": 0.6912, "train/loss": 0.1047,
                                      "rollout/ep_rew_mean": 21.3, "time/fps": 4123.4}},
            }
            with MasterClient(proxy.url, run_id=run_id) as client:
                client.worker_started("bench-wire", None)
                version = cluster.status()["model_version"]
                push = ("bench-wire", version, grads, layout)
                extra = {"loss": loss, "grad_norm": norm, "report": report}
                # The connection is open after the first: the second exchange counts alone.
                version = client.push_gradients(*push, **extra).version
                up, down = proxy.bytes_up, proxy.bytes_down
                client.push_gradients("bench-wire", version, grads, layout, **extra)
                up, down = proxy.bytes_up - up, proxy.bytes_down - down
            vector = layout.flatten(grads)
            body = layout.encode(vector)
            row = {
                "hidden_sizes": hidden, "wire_dtype": dtype, "params": n_params(config),
                "raw_bytes": raw, "body_bytes": len(body), "request_bytes": up, "reply_bytes": down,
                "request_ratio": round(up / raw, 4), "reply_ratio": round(down / raw, 4),
                "encode_ms": median_ms(reps, layout.encode, vector),
                "decode_ms": median_ms(reps, layout.decode, body),
            }
            out["models"][name] = row
            say(f"    {name}: raw {raw:,} B, request {up:,} B ({row['request_ratio']:.3f}), "
                f"reply {down:,} B ({row['reply_ratio']:.3f})")
    return out
