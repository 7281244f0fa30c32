"""Benchmark: many simulated actors against one master, over real HTTP: what it takes and whether
every push is counted.

    .venv/bin/python scripts/bench.py load [--algo a3c] [--env CartPole-v1] [--actors 256]
        [--seconds 120] [--warmup 5] [--receivers 0] [--tls] [--config '{}']
        [--json runs/bench_load.json]

One real master (uvicorn, with --receivers receivers; over TLS with --tls, certificates made
for 127.0.0.1 in a temporary folder) runs --algo on --env with no worker process: a stand-in
worker host is the run's, and this process plays --actors actors, each registered as a worker
of its own on a keep-alive connection of its own (scripts/benchlib/load.py `push_level`). They
push one body made once, before (no environment is stepped): the gradients of the run's model
for an algorithm whose workers send gradients, a rollout of the run's shapes for one whose
workers send experience (scripts/benchlib/ingest.py `rollout_body`). Each pushes as fast as the
master answers, for --warmup seconds unmeasured and then --seconds measured, with the version
its replies name.

It reports pushes and env steps (transitions) a second over the measured window, the latency's
p50, p99 and maximum, the replies by status (5xx apart), the CPU a push cost each process (the
master's own, its receivers', the learner's) over the whole load, and whether every count adds
up: every 2xx reply is an update the master counted (gradients) or a rollout its learner took
(used, or dropped as too old), and every refusal was counted as one. Beside them, the physical
limits of a push of this model, measured in this process in the same run: a copy of the model's
vector, one step of the run's optimizer on it (the parameter server's `FlatNetwork`), and the
bytes of a body and of a weights reply. It exits 1 when a count
does not add up or a reply was a 5xx, so that it can judge a run as well as measure it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from a3c_http.algos.base import Sends
from a3c_http.algos.registry import CONFIGS, algorithm_class, model_for, train_config
from a3c_http.config.training import TrainConfig
from a3c_http.local.cluster import LocalCluster, cpu_delta, cpu_of, wait_for, with_descendants
from a3c_http.net import tls
from a3c_http.optim.flatnet import FlatNetwork
from a3c_http.wire import tensors as wire
from scripts.benchlib.cluster import UNREACHABLE
from scripts.benchlib.ingest import rollout_body
from scripts.benchlib.load import Body, Level, push_level, ready_bodies
from scripts.benchlib.options import config_overrides, number
from scripts.benchlib.procs import end_on_signals
from scripts.benchlib.report import ROOT, say
from scripts.benchlib.server import MAX_STALENESS, median_ms, ms_a_push, standin_master
from scripts.benchlib.shard_push import Shards
from scripts.benchlib.tls_cost import environments

# The algorithms whose workers push what an actor can make once and send again: gradients or
# experience (not best_weights' whole networks).
ALGOS = sorted(a for a in CONFIGS if algorithm_class(train_config(algo=a)).sends != Sends.WEIGHTS)


class RunRefused(Exception):
    """POST /train did not start the run; the master's reason."""


def start(
    cluster: LocalCluster, worker_url: str, fields: dict[str, Any]
) -> tuple[str, TrainConfig]:
    """Start a run of `fields` that never ends by itself, its one worker host `worker_url`, and
    return once its learner runs (an algorithm with one)."""
    fields = {"seed": 0, "max_steps": None, "target_return": UNREACHABLE,
              "heartbeat_timeout_s": 86_400, "max_staleness": MAX_STALENESS, **fields}
    reply = cluster.train(**fields, workers=[worker_url])
    if reply.status_code != 202:
        raise RunRefused(f"the master refused the run ({reply.status_code}): "
                         f"{reply.json().get('detail', reply.text)}")
    if cluster.status().get("learner"):
        wait_for(lambda: cluster.status()["learner"]["running"], 120, "the learner")
    return reply.json()["data"]["run_id"], train_config(**cluster.status()["config"])


def bodies_of(config: TrainConfig) -> tuple[str, list[Body]]:
    """The route an actor of `config`'s algorithm pushes to, and the bodies it pushes in turn."""
    if algorithm_class(config).sends == Sends.EXPERIENCE:
        return "/experience", [Body(rollout_body(config))]
    return "/gradients", ready_bodies(wire.Layout.of(model_for(config), config.wire_dtype))


def limits(config: TrainConfig, body_bytes: int, reps: int = 30) -> dict[str, float]:
    """What a push of `config`'s model costs at the least: the median ms of a copy of its vector
    and of one optimizer step on it (a gradient the master checked), and the bytes each way."""
    import torch

    torch.set_num_threads(1)  # as the master steps (master/app.py)
    net = FlatNetwork(model_for(config), config)
    gradient = torch.full_like(net.flat, 1e-4)
    return {
        "params": net.layout.n_params,
        "copy_ms": median_ms(reps, net.flat.clone),
        "step_ms": median_ms(reps, net.step, [gradient], 1.0, 0.1),
        "body_bytes": body_bytes,
        "reply_bytes": len(net.wire.encode(net.flat)),
    }


def counted(status: dict[str, Any]) -> dict[str, int]:
    """The master's counts of the pushes it took and refused, from its /status."""
    learner = status.get("learner") or {}
    return {
        "updates_applied": status["updates_applied"],
        "updates_rejected": status["updates_rejected"],
        "rollouts_taken": learner.get("rollouts_used", 0) + learner.get("dropped_stale", 0),
        "rollouts_queued": learner.get("queued", 0),
    }


def mismatches(
    route: str, level: Level, before: dict[str, int], after: dict[str, int]
) -> list[str]:
    """What does not add up between the actors' replies (`level`) and the master's counts from
    `before` the load to `after` it: [] when every count does. A rollout taken is one the learner
    used or dropped as too old, or one it holds (`queued`: a batch not yet full)."""
    delta = {k: after[k] - before[k] for k in before}
    refused = sum(n for status, n in level.errors.items() if status.isdigit())
    if route == "/gradients":
        taken, what = delta["updates_applied"], "updates_applied"
    else:
        taken, what = delta["rollouts_taken"] + delta["rollouts_queued"], "rollouts taken or held"
    wrong = []
    if taken != level.ok:
        wrong.append(f"{level.ok:,} pushes answered 2xx, {taken:,} {what}")
    if route == "/gradients" and delta["updates_rejected"] != refused:
        wrong.append(f"{refused:,} refusals, {delta['updates_rejected']:,} updates_rejected")
    return wrong


def receivers(master_pid: int) -> list[int]:
    """The master's receiver processes (master/ingress/receivers.py), from /proc."""
    def command(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    return [p for p in with_descendants([master_pid]) if b"master.ingress.receiver" in command(p)]


def shards_of(cluster: LocalCluster) -> Shards | None:
    """The running run's shards as its actors push to them, or None (a run without shards)."""
    reply = cluster.http.get(f"{cluster.master.url}/shards")
    if reply.status_code != 200:
        return None
    plan = reply.json()
    places = []
    for shard in plan["shards"]:
        where = urlsplit(shard["url"])
        places.append((where.hostname, where.port, shard["lo"], shard["hi"]))
    return Shards(plan["epoch"], places)


def load(cluster: LocalCluster, run_id: str, config: TrainConfig, args: argparse.Namespace,
         client_tls: Any) -> dict[str, Any]:
    """The load of `args.actors` actors on the running run `run_id`, and its figures."""
    route, bodies = bodies_of(config)
    status = cluster.status()
    port = status["fronts"]["port"] if args.receivers else cluster.master.port
    learner = (status.get("learner") or {}).get("pid")
    pids = {"master": [cluster.master.pid], "learner": [learner] if learner else [],
            "receivers": receivers(cluster.master.pid),
            "shards": [s["pid"] for s in status.get("shards") or []]}
    cpu = {role: cpu_of(ps) for role, ps in pids.items()}
    before = counted(status)
    say(f"  {args.actors} actors push {len(bodies[0].data):,}-byte bodies to {route} for "
        f"{args.warmup:g} + {args.seconds:g} s")
    level = push_level(
        cluster.master.host, port, args.actors, bodies, run_id, status["model_version"],
        args.warmup, args.seconds, 10**12, tag="actor", master_port=cluster.master.port,
        tls=client_tls, path=route, shards=shards_of(cluster),
        layout=wire.Layout.of(model_for(config), config.wire_dtype),
    )
    # The learner reports what it took after it took it: the counts settle within a deadline,
    # or their difference is reported.
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: not mismatches(route, level, before, counted(cluster.status())), 60,
                 "the counts to settle")
    after = counted(cluster.status())
    spent = {role: cpu_delta(cpu[role], cpu_of(ps)) for role, ps in pids.items()}
    pushes = level.ok + sum(level.errors.values())
    summary = level.summary()
    steps = config.t_max * config.num_envs
    fives = sum(n for status, n in level.errors.items() if status.startswith("5"))
    return {
        **summary,
        "route": route, "limits": limits(config, len(bodies[0].data)), "env_steps_a_push": steps,
        "transitions_per_s": round((summary["pushes_per_s"] or 0) * steps, 1),
        "5xx": fives,
        "cpu_ms_per_push": {role: ms_a_push(spent[role], pushes) for role in pids if pids[role]},
        "counts": {"before": before, "after": after},
        "mismatches": mismatches(route, level, before, after),
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", default="a3c", choices=ALGOS)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--actors", type=number(int, 1), default=256)
    parser.add_argument("--seconds", type=number(float, 0, more=True), default=120.0,
                        help="the measured window")
    parser.add_argument("--warmup", type=number(float, 0), default=5.0, help="seconds before it")
    parser.add_argument("--receivers", type=number(int, 0), default=0,
                        help="the master's (A3C_RECEIVERS)")
    parser.add_argument("--tls", action="store_true", help="HTTPS, certificates made here")
    parser.add_argument("--config", default="{}", help="the run's config fields, JSON")
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "bench_load.json")
    args = parser.parse_args(argv)
    try:
        overrides = config_overrides(args.config, ("algo", "env_id"), "give --algo and --env",
                                     {"algo": args.algo})
    except ValueError as exc:
        parser.error(f"--config: {exc}")
    end_on_signals()  # Ctrl-C or SIGTERM: the master's `finally` ends it and its children
    fields = {"algo": args.algo, "env_id": args.env, **overrides}
    with tempfile.TemporaryDirectory(prefix="a3c-bench-load-") as tmp:
        env = environments(Path(tmp))["tls"] if args.tls else {}
        served = tls.from_environ(env)
        with standin_master(args.receivers, env) as (cluster, worker):
            try:
                run_id, config = start(cluster, worker.url, fields)
            except RunRefused as exc:
                say(str(exc))
                return 2
            out = load(cluster, run_id, config, args,
                       served.client_context() if served.serves else None)
    out = {"algo": args.algo, "env_id": args.env, "actors": args.actors,
           "receivers": args.receivers, "tls": args.tls, "config": fields, **out}
    cpu = ", ".join(f"{role} {ms} ms" for role, ms in out["cpu_ms_per_push"].items())
    say(f"{args.algo} on {args.env}, {args.actors} actors{' over TLS' if args.tls else ''}: "
        f"{out['pushes_per_s'] or 0:,.0f} pushes/s, {out['transitions_per_s']:,.0f} env steps/s, "
        f"p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms, max {out['max_ms']} ms; "
        f"{out['ok']:,} answered 2xx, others {out['errors'] or 'none'} ({out['5xx']} 5xx); "
        f"CPU a push: {cpu}")
    floor = out["limits"]
    say(f"limits of a push of this model ({floor['params']:,} parameters): a copy "
        f"{floor['copy_ms']} ms, an optimizer step {floor['step_ms']} ms, "
        f"{floor['body_bytes']:,} bytes in and {floor['reply_bytes']:,} out")
    say("counts: " + ("every one adds up" if not out["mismatches"] else
                      "DO NOT add up: " + "; ".join(out["mismatches"])))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    return 1 if out["mismatches"] or out["5xx"] else 0
