"""An A3C run with parameter-server shards on real processes (the session cluster's master and
workers): the workers' pushes go through the shards, and a shard killed (kill -9) mid-run is put
back with every other at one version while the run goes on. The shards' protocol with a test
playing the worker is tests/service/test_shards.py's."""

from __future__ import annotations

import os
import signal

import pytest

from a3c_http.local.cluster import LocalCluster, wait_for
from tests.support.common import ENDLESS_RUN, PATIENT

pytestmark = pytest.mark.integration


def test_a_shard_killed_in_a_running_a3c_run_is_put_back_and_the_next_run_starts_clean(
    cluster: LocalCluster,
) -> None:
    workers = [cluster.workers[i].url for i in PATIENT]
    assert cluster.train(**ENDLESS_RUN, shards=2, workers=workers).status_code == 202

    def shards_at_one_version(past: int) -> bool:
        shards = cluster.status()["shards"] or []
        versions = {s["version"] for s in shards}
        return (
            len(shards) == 2
            and all(s["alive"] for s in shards)
            and (len(versions) == 1 and versions.pop() > past)
        )

    wait_for(lambda: cluster.status()["updates_applied"] >= 20, 60, "pushes through the shards")
    before = cluster.status()
    victim = before["shards"][0]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: (
            shards_at_one_version(before["model_version"])
            and cluster.status()["shards"][0]["pid"] != victim
        ),
        60,
        "every shard back at one version",
    )
    # The run goes on: both workers push through the shards again, none of them failed.
    after = cluster.status()
    wait_for(
        lambda: cluster.status()["updates_applied"] >= after["updates_applied"] + 10,
        60,
        "pushes after the reset",
    )
    status = cluster.status()
    assert status["state"] == "running"
    assert {w["state"] for w in status["workers"]} == {"running"}, [
        w["error"] for w in status["workers"]
    ]
    cluster.stop_run()
    # The next run is none of the shards' business: a learner's starts from its own network
    # (an earlier run's shards once gathered their optimizer state into it, and it failed).
    assert cluster.train(**ENDLESS_RUN, algo="ppo", workers=workers).status_code == 202
    wait_for(lambda: (cluster.status()["learner"] or {}).get("updates", 0) > 0, 60, "an update")
    assert cluster.status()["shards"] is None and cluster.status()["learner"]["error"] is None
    cluster.stop_run()
