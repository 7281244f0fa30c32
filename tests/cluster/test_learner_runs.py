"""A PPO run on real processes: workers that only act push rollouts, the learner process beside
the master learns from them, and a master killed with kill -9 takes the run up again with a new
learner from its last save (the learner of the dead master ends by itself)."""

from __future__ import annotations

import pytest

from a3c_http.local.cluster import LocalCluster, wait_for, with_descendants
from a3c_http.store.runstore import RunStore
from tests.support.common import pid_running

pytestmark = pytest.mark.integration

RUN = {
    "algo": "ppo",
    "env_id": "CartPole-v1",
    "seed": 5,
    "target_return": 1e9,
    "max_steps": None,
    "heartbeat_timeout_s": 30,
}


def test_a_ppo_run_learns_and_survives_a_killed_master(cluster: LocalCluster) -> None:
    workers = [w.url for w in cluster.workers[:2]]
    assert cluster.train(**RUN, workers=workers).status_code == 202
    # Random play on CartPole averages about 22; the learner's updates take it well past that.
    learned = wait_for(
        lambda: (s := cluster.status())["mean_return_100"] is not None
        and s["mean_return_100"] >= 50
        and s,
        120,
        "the PPO run to learn",
    )
    assert learned["learner"]["updates"] >= 5 and learned["learner"]["error"] is None
    assert all(w["metrics"].get("train/loss") is None for w in learned["workers"])  # only act
    learner_pid = learned["learner"]["pid"]
    assert learner_pid in with_descendants([cluster.master.pid])
    version = learned["model_version"]
    wait_for(
        lambda: RunStore(cluster.run_dir).load().state["model_version"] > version,
        60,
        "a save of later weights",
    )
    cluster.master.kill()
    saved = RunStore(cluster.run_dir).load()
    wait_for(lambda: not pid_running(learner_pid), 30, "the learner to end with its master")
    cluster.master.start().wait_healthy()
    resumed = cluster.status()
    assert resumed["state"] == "running" and resumed["learner"]["running"]
    assert resumed["model_version"] > saved.state["model_version"]  # skipped after the crash
    assert resumed["global_episode"] >= saved.state["stats"]["global_episode"]
    wait_for(
        lambda: cluster.status()["learner"]["updates"] >= 3,
        120,
        "the resumed learner to learn from the workers' rollouts",
    )
    assert cluster.stop_run()
