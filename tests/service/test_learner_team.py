"""A run's learners as a team of processes (`learners`, a3c_http/optim/team.py over
torch.distributed's gloo) through the master's HTTP layer: they learn as one from the rollouts
pushed, and a learner of the team that dies has the whole team started again from the newest
weights. What their steps are is shown with tensors alone (tests/unit/test_team.py)."""

from __future__ import annotations

import os
import signal

from fastapi.testclient import TestClient

from a3c_http.local.cluster import wait_for
from tests.service.test_experience import PPO, learner, push, rollout
from tests.support.common import pid_running
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import client as client
from tests.support.master_api import launched as launched
from tests.support.master_api import start_run, status


def test_a_team_of_learners_learns_as_one_and_starts_again_together(
    client: TestClient, launched: list
) -> None:
    start_run(client, **PPO, queue_size=2, learners=2)
    version = status(client)["model_version"]
    team = learner(client)
    leader, (follower,) = team["pid"], team["follower_pids"]
    for seq in (1, 2):  # one update's rollouts: one for each learner
        assert push(client, rollout(), version, seq=seq).status_code == 204
    wait_for(lambda: learner(client)["updates"] == 1, 60, "the team's first update")
    assert status(client)["model_version"] == version + 1

    os.kill(follower, signal.SIGKILL)
    again = wait_for(
        lambda: (t := learner(client))["restarts"] == 1 and t["follower_pids"] and t, 60,
        "the team started again",
    )
    assert "learner 1 of its team ended (exit code -9)" in again["error"]
    assert again["pid"] != leader and again["follower_pids"] != [follower]
    for seq in (3, 4):
        assert push(client, rollout(), version + 1, seq=seq).status_code == 204
    wait_for(lambda: learner(client)["updates"] == 2, 60, "the new team's update")
    assert status(client)["model_version"] == version + 2  # on from the newest weights

    pids = [again["pid"], *again["follower_pids"]]
    assert client.post("/stop", json={}).status_code == 200
    wait_for(lambda: not any(map(pid_running, pids)), 30, "the team to end with the run")
