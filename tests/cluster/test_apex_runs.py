"""An Ape-X run on real processes: actors push prioritized experience to the learner's replay, and
after a kill -9 of the master the run is taken up again with its target network's version and a new
learner."""

from __future__ import annotations

import pytest

from a3c_http.local.cluster import LocalCluster, wait_for
from a3c_http.store.runstore import RunStore

pytestmark = pytest.mark.integration

COMMON = {
    "env_id": "CartPole-v1",
    "seed": 3,
    "target_return": 1e9,
    "max_steps": None,
    "heartbeat_timeout_s": 30,
    "hidden_sizes": [32],
    "learning_starts": 64,
    "target_update": 20,
    "eval_every_updates": None,
    "solved_on": "train",
}
APEX = {"algo": "apex", "num_envs": 2, "t_max": 16, "gradient_steps": 4, "target_update": 8}


# apex's: its target network goes from the learner process through the master and back to a new
# learner. dqn's target on the master is shown in-process (tests/service/test_target_network.py),
# its workers' use of it with a fake port (tests/unit/test_algorithms.py).
def test_an_apex_run_learns_and_keeps_its_target_network_across_a_killed_master(
    cluster: LocalCluster,
) -> None:
    workers = [w.url for w in cluster.workers[:2]]
    body = {**COMMON, **APEX}
    assert cluster.train(**body, workers=workers).status_code == 202
    refreshed = wait_for(
        lambda: (s := cluster.status())["target_version"]
        and s["target_version"] > 0
        and s["learner"]["metrics"]
        and s,
        120,
        "the target network to be refreshed",
    )
    exposition = cluster.http.get(f"{cluster.master.url}/metrics").text
    assert "\na3c_target_version " in exposition
    # the learner's replay, in /status and /metrics
    assert refreshed["learner"]["metrics"]["replay/size"] >= COMMON["learning_starts"]
    assert "\na3c_replay_size " in exposition
    wait_for(
        lambda: (RunStore(cluster.run_dir).load().state.get("target_version") or 0) > 0,
        60,
        "a save of the refreshed target network",
    )
    cluster.master.kill()
    saved = RunStore(cluster.run_dir).load()
    assert saved.target is not None
    cluster.master.start().wait_healthy()
    resumed = cluster.status()
    assert resumed["state"] == "running"
    # Taken up from the save (tests/service/test_target_network.py: as it was saved); a resumed
    # learner learning on: tests/cluster/test_learner_runs.py.
    assert resumed["target_version"] >= saved.state["target_version"]
    assert resumed["learner"]["running"]
    assert cluster.stop_run()
