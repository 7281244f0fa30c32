"""Local clusters and their env steps per second: a master and workers on free loopback ports
(pinned core by core for `scale --pin`), the learner in one process, the cluster with one and two
workers (the bar's `throughput`), and the 2-worker cluster with its workers behind a loopback
proxy that delays each direction (`latency`), plus the time to solve at 5 ms each way.

Rates are of the steady state: from the first sample past 10 % of the budget to the last before
the end, so start-up (uvicorn, torch, the environments) is not counted. The cluster's samples are
its workers' own step counters (GET /status `env_steps`, live), stamped here; the master's count
trails them by up to a heartbeat.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from a3c_http.algos.a3c.single_process import train
from a3c_http.algos.registry import train_config
from a3c_http.local.cluster import LocalCluster, ServiceProcess, free_port, wait_for
from a3c_http.testing.delayproxy import DelayProxy
from scripts.benchlib.procs import receivers_cores
from scripts.benchlib.report import PROGRESS_S, say

# How long a finished run's final evaluation may take (MinAtar's 30 greedy episodes take seconds).
FINAL_EVAL_S = 600

STEADY_FROM = 0.1  # the share of the budget left out as start-up
# Nothing stops early: the target return is out of reach.
UNREACHABLE = 1e9


def steady_rate(samples: list[tuple[float, int]], budget: int) -> tuple[float | None, bool]:
    """Steps per second between the first sample (time, steps) past STEADY_FROM of the budget
    and the last one, and whether that is the steady state; with fewer than two such samples,
    the rate over all of them (False)."""
    past = [s for s in samples if s[1] >= STEADY_FROM * budget]
    steady = len(past) >= 2 and past[-1][0] > past[0][0]
    chosen = past if steady else samples
    if len(chosen) < 2 or chosen[-1][0] <= chosen[0][0]:
        return None, False
    (t0, s0), (t1, s1) = chosen[0], chosen[-1]
    return round((s1 - s0) / (t1 - t0), 1), steady


def learner_rate(budget: int) -> dict:
    """(a): the learner in one process, without HTTP, default config, for `budget` env steps."""
    samples: list[tuple[float, int]] = []
    last_said = [time.monotonic()]

    def progress(steps: int) -> None:
        now = time.monotonic()
        samples.append((now, steps))
        if now - last_said[0] >= PROGRESS_S:
            last_said[0] = now
            say(f"    learner: {steps:,} env steps")

    result = train(train_config(seed=0, target_return=UNREACHABLE), budget, progress=progress)
    rate, steady = steady_rate(samples, budget)
    return {"steps_per_s": rate, "steady": steady, "env_steps": result.env_steps,
            "seconds": round(result.seconds, 3), "updates": result.updates}


@contextlib.contextmanager
def local_cluster(n_workers: int, pin: list[str] | None = None) -> Iterator[LocalCluster]:
    """A master and `n_workers` workers on free loopback ports, ended by pid on the way out;
    `pin`: taskset's core lists for the master and then each worker (taskset execs uvicorn: the
    pid stays the one the cluster ends)."""
    with tempfile.TemporaryDirectory(prefix="a3c-bench-") as tmp:
        cluster = LocalCluster(
            Path(tmp) / "run", Path(tmp) / "logs",
            [("127.0.0.1", free_port()) for _ in range(n_workers)],
        )
        for process, cores in zip(cluster.processes, pin or [], strict=bool(pin)):
            process.wrapper = ["taskset", "-c", cores]
        try:
            say(f"  starting a master and {n_workers} worker{'s' * (n_workers > 1)}")
            cluster.start(timeout_s=120)
            yield cluster
        finally:
            cluster.close()


@contextlib.contextmanager
def cluster_of(n: int, pin: list[str] | None, cores: list[int]) -> Iterator[LocalCluster]:
    """`local_cluster` of `n` workers, pinned as `pin` says (procs.pin_sets), and the master's
    receivers, if it has any, moved to procs.receivers_cores once they run (they start on the
    master's core, which they inherit; one the master starts again later stays there)."""
    with local_cluster(n, pin) as cluster:
        if pin:
            for pid in (cluster.status().get("fronts") or {}).get("pids", []):
                os.sched_setaffinity(pid, receivers_cores(cores))
        yield cluster


def _shares(statuses: list[dict]) -> dict:
    spent = {k: sum(s["time"][k] for s in statuses) for k in ("rollout_s", "learn_s", "http_s")}
    total = sum(spent.values()) or 1.0
    return {f"{k.removesuffix('_s')}_share": round(v / total, 4) for k, v in spent.items()}


def cluster_rate(
    cluster: LocalCluster,
    workers: list[ServiceProcess],
    budget: int,
    cap_s: float,
    label: str,
    **body: object,
) -> dict:
    """One run of `workers` for `budget` env steps (or `cap_s` seconds, then stopped), default
    config plus `body`; its steady rate and where the workers spent their time."""
    reply = cluster.train(
        seed=0, max_steps=budget, target_return=UNREACHABLE,
        workers=[w.url for w in workers], **body,
    )
    reply.raise_for_status()
    samples: list[tuple[float, int]] = []
    last_said = [time.monotonic()]

    def finished() -> dict | None:
        steps = sum(cluster.worker_status(w)["env_steps"] for w in workers)
        now = time.monotonic()
        status = cluster.status()
        if status["state"] != "running":
            return status
        samples.append((now, steps))
        if now - last_said[0] >= PROGRESS_S:
            last_said[0] = now
            rate, _ = steady_rate(samples, budget)
            say(f"    {label}: {steps:,} env steps" + (f", {rate:,.0f}/s" if rate else ""))
        return None

    capped = False
    try:
        wait_for(finished, cap_s, f"{label} to reach {budget:,} env steps", interval_s=0.25)
    except TimeoutError:
        capped = True
    status, _ = cluster.stop_run()
    rate, steady = steady_rate(samples, budget)
    return {
        "steps_per_s": rate, "steady": steady, "capped": capped,
        "env_steps": status["env_steps"], "elapsed_s": status["elapsed_s"],
        "updates": status["updates_applied"], "rejected": status["updates_rejected"],
        **_shares([cluster.worker_status(w) for w in workers]),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def throughput(budget: int, cap_s: float, rounds: int = 1) -> dict:
    """(a), (b) and (c) in turn, `rounds` times. Each ratio is taken within its round, and each
    figure given is the median over the rounds (with every round's in `rates` and `ratios`): on
    this 2-core machine one round's ratio ranged from 0.84 to 0.96 for the same code, the
    learner's rate alone moving by 10 %."""
    runs: dict[str, list[dict]] = {"learner": [], "cluster_1": [], "cluster_2": []}
    with local_cluster(2) as cluster:
        for k in range(rounds):
            tag = f", round {k + 1} of {rounds}" if rounds > 1 else ""
            say(f"  (a) the learner in one process, {budget:,} env steps{tag}")
            runs["learner"].append(learner := learner_rate(budget))
            for n in (1, 2):
                say(f"  ({'bc'[n - 1]}) the cluster with {n} worker{'s' * (n > 1)}{tag}")
                r = cluster_rate(
                    cluster, cluster.workers[:n], budget, cap_s, f"cluster, {n} worker(s)"
                )
                r["ratio"] = _ratio(r["steps_per_s"], learner["steps_per_s"])
                runs[f"cluster_{n}"].append(r)
    out: dict = {"budget": budget, "rounds": rounds}
    for key, results in runs.items():
        out[key] = median_round(results)
    return out


def median_round(results: list[dict]) -> dict:
    """The round whose rate is the median (the lower one of an even count), with every round's
    rate and ratio, and the median of the ratios."""
    rates = [r["steps_per_s"] for r in results]
    measured = sorted((r for r in results if r["steps_per_s"]), key=lambda r: r["steps_per_s"])
    chosen = dict(measured[(len(measured) - 1) // 2] if measured else results[-1])
    chosen["rates"] = rates
    if "ratio" in chosen:
        ratios = [r["ratio"] for r in results]
        chosen["ratios"] = ratios
        known = [x for x in ratios if x is not None]
        chosen["ratio"] = round(statistics.median(known), 4) if known else None
    return chosen


def solve_run(cluster: LocalCluster, cap_s: float, label: str, **body: object) -> dict:
    """One run of the default config (CartPole-v1's own target; seed 0 unless `body` gives
    one) until solved or `cap_s`."""
    cluster.train(**{"seed": 0, **body}).raise_for_status()
    last_said = [time.monotonic()]

    def finished() -> dict | None:
        status = cluster.status()
        if status["state"] != "running":
            return status
        if time.monotonic() - last_said[0] >= PROGRESS_S:
            last_said[0] = time.monotonic()
            mean = status["mean_return_100"]
            say(f"    {label}: {status['elapsed_s']:.0f} s, {status['env_steps']:,} env steps, "
                f"mean return {'-' if mean is None else f'{mean:.1f}'}")
        return None

    with contextlib.suppress(TimeoutError):
        wait_for(finished, cap_s, f"{label} to solve", interval_s=0.5)
    status, _ = cluster.stop_run()
    return {"solved": status["solved"], "seconds": status["elapsed_s"],
            "env_steps": status["env_steps"], "mean_return_100": status["mean_return_100"]}


def latency(budget: int, cap_s: float, delays_ms: list[float], solve_cap_s: float) -> dict:
    """The 2-worker cluster with its workers reaching the master through a DelayProxy (the
    master's own calls to the workers go direct)."""
    out: dict = {"budget": budget, "levels": []}
    with local_cluster(2) as cluster:
        for delay in delays_ms:
            say(f"  {delay:g} ms each way")
            with DelayProxy(cluster.master.port, delay / 1000) as proxy:
                r = cluster_rate(cluster, cluster.workers, budget, cap_s,
                                 f"{delay:g} ms", master_url=proxy.url)
                r.update(delay_ms=delay, bytes_up=proxy.bytes_up, bytes_down=proxy.bytes_down)
            out["levels"].append(r)
        base = next((r["steps_per_s"] for r in out["levels"] if r["delay_ms"] == 0), None)
        for r in out["levels"]:
            r["ratio"] = _ratio(r["steps_per_s"], base)
        say("  time to solve CartPole-v1 at 5 ms each way")
        with DelayProxy(cluster.master.port, 0.005) as proxy:
            out["solve_5ms"] = solve_run(cluster, solve_cap_s, "5 ms", master_url=proxy.url)
    return out


def _final_evaluation(cluster: LocalCluster) -> dict:
    """/status once the master has evaluated the finished run's final weights (as SB3's
    evaluation at the end of its budget); as it stands if that takes over FINAL_EVAL_S."""

    def evaluated() -> dict | None:
        now = cluster.status()
        return now if now["eval_model_version"] == now["model_version"] else None

    try:
        return wait_for(evaluated, FINAL_EVAL_S, "the final evaluation", interval_s=1.0)
    except TimeoutError:
        say(f"    no final evaluation within {FINAL_EVAL_S} s: the latest is reported")
        return cluster.status()


def fresh_run(index: int, n_workers: int, overrides: dict, cap_s: float) -> dict:
    """Run `index` (its seed, unless `overrides` gives one) on a fresh cluster of `n_workers`
    workers, for at most `cap_s` seconds once started: how it ended, and what staleness shows
    (the mean staleness of the applied gradients, the pushes refused and why, the workers'
    in-flight limits sampled every second) and where the workers spent their time."""
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
            if status["state"] == "finished" and status["config"]["eval_every_updates"]:
                status = _final_evaluation(cluster)
            workers = [cluster.worker_status(w) for w in cluster.workers]
        finally:
            cluster.close()
    spent = {k: sum(w["time"][k] for w in workers) for k in ("rollout_s", "learn_s", "http_s")}
    total = sum(spent.values()) or 1.0
    # The master's clock once the run is solved or finished (at max_steps); else the cap's.
    finished = status["solved"] or status["state"] == "finished"
    # A run solved on an evaluation: the env steps its evaluated weights were made from, as
    # SB3's count at its own evaluation (which stops its training while it plays); the steps
    # the actors made while the master played are in the wall time alone.
    on_eval = status["solved"] and status["config"].get("solved_on") == "eval"
    env_steps = status["eval_global_steps"] if on_eval else status["env_steps"]
    return {
        "solved": status["solved"],
        "seconds": status["elapsed_s"] if finished else wall,
        "episodes": status["global_episode"],
        "steps": status["global_steps"],
        "env_steps": env_steps,
        "mean_return_100": status["mean_return_100"],
        "eval_return": status["eval_mean_return"],  # the final weights' (latest), if any
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
