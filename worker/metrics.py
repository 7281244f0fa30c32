"""A worker's `GET /metrics`: its rollout, gradient and HTTP times and its exchanges with the
master, in Prometheus's text format (prometheus-client), read from one `/status` snapshot at
scrape time so that both agree."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class WorkerCollector(Collector):
    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        s = self.status()
        for name, key, doc in (
            ("a3c_worker_env_steps", "env_steps", "Environment steps of this worker's run."),
            ("a3c_worker_episodes", "episodes", "Episodes this worker finished in its run."),
            ("a3c_worker_updates", "updates", "Gradients or weights the master took from it."),
            ("a3c_worker_http_retries", "http_retries", "Requests to the master retried."),
        ):
            yield CounterMetricFamily(name, doc, value=s[key])
        seconds = CounterMetricFamily(
            "a3c_worker_seconds",
            "Seconds spent in rollouts, in gradients and waiting for the master.",
            labels=["phase"],
        )
        for phase in ("rollout", "learn", "http"):
            seconds.add_metric([phase], s["time"][f"{phase}_s"])
        yield seconds
        exchanges = s["exchanges"]
        yield GaugeMetricFamily(
            "a3c_worker_pushes_in_flight", "Gradient pushes on their way.",
            value=exchanges["in_flight"],
        )
        yield CounterMetricFamily(
            "a3c_worker_pushes_refused", "Pushes the master refused (stale or outliers).",
            value=exchanges["refused"],
        )
        if exchanges["round_trip_ms"] is not None:
            yield GaugeMetricFamily(
                "a3c_worker_round_trip_seconds", "The shortest recent round trip of a push.",
                value=exchanges["round_trip_ms"] / 1000,
            )
        if s["steps_per_s"] is not None:
            yield GaugeMetricFamily(
                "a3c_worker_env_steps_per_second", "Env steps per second of this run.",
                value=s["steps_per_s"],
            )


def exposition(status: Callable[[], dict[str, Any]]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(status))
    return generate_latest(registry)
