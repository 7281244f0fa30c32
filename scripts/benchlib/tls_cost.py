"""Benchmark: what TLS costs the master, pushes/s and its CPU a gradient push over plain HTTP, over
TLS and over mutual TLS, side by side.

    .venv/bin/python scripts/bench.py tls [--model default] [--workers 16] [--rounds 3]
        [--warmup 2] [--window 6] [--connects 50] [--json runs/bench_tls.json]

Certificates are made for 127.0.0.1 by `a3c-certs`'s functions (a3c_http/cli/certs.py, the `tls`
extra) in a temporary folder. One master per way (scripts/benchlib/server.py `standin_master`,
with A3C_TLS_* for two of them) runs the model. Per round, for each way in turn (alternating, so
that the machine's other load falls on each, and each way first in one round of three),
--workers simulated workers push as fast as the master answers over connections they keep
(scripts/benchlib/load.py `push_level`; a worker keeps its connection, so the handshake is paid
once). The master's CPU over the level divided by the pushes it answered is that round's figure;
the medians over the rounds are printed. Then what a new connection costs: the median time of
--connects connections to the master opened, with their handshake, and closed, by way.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path

from a3c_http.algos.registry import model_for
from a3c_http.cli.certs import CertError, make_ca, make_host
from a3c_http.local.cluster import LocalCluster, cpu_delta
from a3c_http.net import tls
from a3c_http.wire import tensors as wire
from scripts.benchlib.load import push_level, ready_bodies
from scripts.benchlib.report import ROOT, say
from scripts.benchlib.server import MASTER_RUNS, standin_master, start_run

WAYS = ("plain", "tls", "mutual tls")


def environments(folder: Path) -> dict[str, dict[str, str]]:
    """The master's A3C_TLS_* of each way, with certificates made in `folder`."""
    make_ca(folder)
    host = make_host(folder, "master", ["127.0.0.1"])
    served = {"A3C_TLS_CERT": str(host.cert), "A3C_TLS_KEY": str(host.key),
              "A3C_TLS_CA": str(folder / "ca.crt")}
    return {"plain": {}, "tls": served, "mutual tls": {**served, "A3C_TLS_MUTUAL": "true"}}


def connect_ms(cluster: LocalCluster, served: tls.TLS, n: int) -> float:
    """The median time to open a connection to the master, its TLS handshake included where it
    serves TLS, in milliseconds."""
    host, port = cluster.master.host, cluster.master.port
    times = []
    for _ in range(n):
        started = time.perf_counter()
        with socket.create_connection((host, port), timeout=10) as sock:
            if served.serves:
                served.client_context().wrap_socket(sock, server_hostname=host).close()
            times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 3)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", choices=sorted(MASTER_RUNS))
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--connects", type=int, default=50)
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "bench_tls.json")
    args = parser.parse_args(argv)
    hidden, dtype, extra = MASTER_RUNS[args.model]
    rounds: dict[str, list[dict]] = {way: [] for way in WAYS}
    out: dict = {"model": args.model, "workers": args.workers, "rounds": rounds, "ways": {}}
    with tempfile.TemporaryDirectory(prefix="a3c-bench-tls-") as tmp:
        try:
            envs = environments(Path(tmp))
        except CertError as exc:
            say(f"cannot make the certificates: {exc}")
            return 2
        masters, runs = {}, {}
        try:
            for way in WAYS:
                say(f"  {way}:")
                masters[way] = standin_master(env=envs[way])
                cluster, worker = masters[way].__enter__()
                run_id, config = start_run(cluster, worker, hidden, dtype, **extra)
                layout = wire.Layout.of(model_for(config), dtype)
                runs[way] = (cluster, run_id, ready_bodies(layout), tls.from_environ(envs[way]))
            for i in range(args.rounds):
                for way in WAYS[i % 3:] + WAYS[:i % 3]:  # each way first in one round of three
                    cluster, run_id, bodies, served = runs[way]
                    row = _round(cluster, run_id, bodies, served, args, f"{way[0]}{i}")
                    rounds[way].append(row)
                    say(f"  round {i + 1}, {way}: {row['pushes_per_s'] or 0:,.0f} pushes/s, "
                        f"{row['master_ms_per_push']} ms of the master's CPU a push, "
                        f"p99 {row['p99_ms']} ms, {row['errors'] or 0} errors")
            for way in WAYS:
                cluster, _, _, served = runs[way]
                out["ways"][way] = {
                    key: statistics.median(r[key] or 0 for r in rounds[way])
                    for key in ("pushes_per_s", "master_ms_per_push", "p50_ms", "p99_ms")
                }
                out["ways"][way]["connect_ms"] = connect_ms(cluster, served, args.connects)
        finally:
            for context in masters.values():
                context.__exit__(None, None, None)
    plain = out["ways"]["plain"]
    for way, f in out["ways"].items():
        rate = f["pushes_per_s"] / max(plain["pushes_per_s"], 1e-9)
        cost = f["master_ms_per_push"] / max(plain["master_ms_per_push"], 1e-9)
        say(f"{way}: {f['pushes_per_s']:,.0f} pushes/s ({rate:.2f}x plain), master "
            f"{f['master_ms_per_push']} ms CPU a push ({cost:.2f}x), p50 {f['p50_ms']} ms, "
            f"p99 {f['p99_ms']} ms, a new connection {f['connect_ms']} ms (medians of "
            f"{args.rounds} rounds, {args.workers} workers, {args.model} model)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    return 0


def _round(cluster: LocalCluster, run_id: str, bodies: list, served: tls.TLS,
           args: argparse.Namespace, tag: str) -> dict:
    before, cpu = cluster.status(), cluster.master.cpu_seconds()
    level = push_level(
        cluster.master.host, cluster.master.port, args.workers, bodies, run_id,
        before["model_version"], args.warmup, args.window, 10**9, tag=f"tls-{tag}",
        tls=served.client_context() if served.serves else None,
    )
    after, now = cluster.status(), cluster.master.cpu_seconds()
    answered = sum(after[k] - before[k] for k in ("updates_applied", "updates_rejected"))
    summary = level.summary()
    return {
        "pushes_per_s": summary["pushes_per_s"],
        "p50_ms": summary.get("p50_ms"),
        "p99_ms": summary.get("p99_ms"),
        "errors": summary["errors"],
        "master_ms_per_push": round((cpu_delta(cpu, now) or 0.0) * 1000 / max(answered, 1), 4),
    }
