"""`GET /metrics`: the master's figures in Prometheus's text format, made with prometheus-client.

Everything `/status` shows is read from one `/status` snapshot at scrape time (a custom
collector), so a scrape and `/status` taken at the same moment agree exactly, and nothing is
counted twice. The only figure `/status` does not have is the latency of the gradient exchange, a
histogram the `/gradients` route observes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from master.run.records import WorkerState

WORKER_STATES: tuple[WorkerState, ...] = ("starting", "running", "done", "lost", "failed")


class StatusCollector(Collector):
    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        s = self.status()
        yield _counter("a3c_episodes", "Episodes reported in this run.", s["global_episode"])
        yield _counter(
            "a3c_env_steps",
            "Environment steps of this run (reported episodes and those going on).",
            s["env_steps"],
        )
        for name, key, doc in (
            ("a3c_best_score", "best_score", "The best episode return of this run."),
            ("a3c_moving_average_return", "moving_average", "avg = 0.99 avg + 0.01 return."),
            ("a3c_mean_return_100", "mean_return_100", "Mean return of the last 100 episodes."),
            # what a run judged on evaluations (solved_on eval) is judged by
            ("a3c_eval_mean_return", "eval_mean_return", "Mean return of the latest evaluation "
             "of the global weights (eval_episodes episodes, as a3c-evaluate plays them)."),
        ):
            # no sample rather than a made-up 0 before the first episode (or evaluation)
            if s[key] is not None:
                yield GaugeMetricFamily(name, doc, value=s[key])
        yield GaugeMetricFamily(
            "a3c_model_version", "Version of the global weights.", value=s["model_version"]
        )
        yield _counter(
            "a3c_updates_applied", "Gradients (or weights) applied.", s["updates_applied"]
        )
        rejected = CounterMetricFamily(
            "a3c_updates_rejected", "Updates refused, by reason.", labels=["reason"]
        )
        by_reason = {"invalid": 0, "stale": 0, "outlier": 0, "round": 0}
        by_reason.update(s.get("updates_rejected_by") or {})
        # Refusals of a run folder saved before reasons were counted.
        unknown = s["updates_rejected"] - sum(by_reason.values())
        if unknown > 0:
            by_reason["unknown"] = unknown
        for reason, count in by_reason.items():
            rejected.add_metric([reason], count)
        yield rejected
        workers = GaugeMetricFamily("a3c_workers", "Workers by state.", labels=["state"])
        states = Counter(w["state"] for w in s["workers"])
        for state in WORKER_STATES:
            workers.add_metric([state], states.get(state, 0))
        yield workers
        # Who joined and who left: origin joined (POST /join), launched (started by the master)
        # or registered (POST /worker_started), by state (done: it left; lost: it vanished).
        members = GaugeMetricFamily(
            "a3c_workers_by_origin", "Workers by how they came and their state.",
            labels=["origin", "state"],
        )
        for (origin, state), n in sorted(
            Counter((w.get("origin") or "registered", w["state"]) for w in s["workers"]).items()
        ):
            members.add_metric([origin, state], n)
        yield members
        yield GaugeMetricFamily(
            "a3c_workers_waiting", "Workers that asked to join while no run was running.",
            value=len(s.get("waiting_workers") or []),
        )
        # Not a3c_worker_env_steps_per_second: each worker exports that one itself, and a sum()
        # over both would count every worker twice. No name is exported by both services.
        speed = GaugeMetricFamily(
            "a3c_worker_reported_env_steps_per_second",
            "A worker's env steps per second, as it last reported them to the master.",
            labels=["worker_id"],
        )
        seen = GaugeMetricFamily(
            "a3c_worker_last_seen_seconds",
            "Seconds since the master last heard from a worker.",
            labels=["worker_id"],
        )
        for w in s["workers"]:
            if w.get("steps_per_s") is not None:
                speed.add_metric([w["worker_id"]], w["steps_per_s"])
            seen.add_metric([w["worker_id"]], w["last_seen_s"])
        yield speed
        yield seen
        save_error = s.get("save_error") or {}
        yield GaugeMetricFamily(
            "a3c_save_failures",
            "Saves of the run folder that failed in a row (0 once one succeeds).",
            value=save_error.get("failures", 0),
        )
        if s.get("last_saved_at") is not None:
            yield GaugeMetricFamily(
                "a3c_last_save_timestamp_seconds",
                "Unix time of the last successful save of the run folder.",
                value=s["last_saved_at"],
            )
        learner = s.get("learner")
        if learner is not None:  # ppo, impala and apex runs (master/learning/learner_process.py)
            yield _counter("a3c_learner_updates", "Updates of the learner.", learner["updates"])
            yield _counter(
                "a3c_learner_dropped_stale",
                "Rollouts the learner dropped, more than max_policy_lag versions old.",
                learner["dropped_stale"],
            )
            yield GaugeMetricFamily(
                "a3c_learner_queued", "Rollouts waiting for the learner.", value=learner["queued"]
            )
            replay = learner["metrics"].get("replay/size")
            if replay is not None:  # apex, apex_dpg, sac: the replay beside the master
                yield GaugeMetricFamily(
                    "a3c_replay_size", "Transitions in the learner's replay.", value=replay
                )
        if s.get("target_version") is not None:  # dqn and apex runs
            yield GaugeMetricFamily(
                "a3c_target_version",
                "The version of the target network.",
                value=s["target_version"],
            )


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class MasterMetrics:
    """The master's registry: the status collector and the gradient exchange's histogram."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatusCollector(status))
        self.push_seconds = Histogram(
            "a3c_gradient_push_seconds",
            "Time the master takes to answer a gradient push, from its arrival to its reply.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
