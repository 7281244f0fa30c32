"""What a seed repeats (README, Reproducibility): a run of one worker that waits for each reply
(`max_in_flight: 0`) repeats exactly, to the last bit of its weights, on the session cluster's
real processes."""

from __future__ import annotations

import pytest

from a3c_http.local.cluster import LocalCluster
from tests.support.common import PATIENT

pytestmark = pytest.mark.integration

RUN = {"env_id": "CartPole-v1", "seed": 5, "num_envs": 2, "max_steps": 4000, "max_in_flight": 0}


def run_once(cluster: LocalCluster) -> tuple[bytes, dict]:
    worker = cluster.workers[PATIENT[0]]
    reply = cluster.train(**RUN, workers=[worker.url])
    assert reply.status_code == 202, reply.text
    cluster.wait_finished()
    status, _ = cluster.wait_workers_settled([worker])
    weights = cluster.http.get(f"{cluster.master.url}/global_model_weights")
    weights.raise_for_status()
    counts = {k: status[k] for k in ("global_episode", "global_steps", "updates_applied")}
    return weights.content, counts


def test_one_worker_without_pushes_in_flight_repeats_a_run_exactly(cluster: LocalCluster) -> None:
    first, second = run_once(cluster), run_once(cluster)
    assert first[1] == second[1]
    assert first[0] == second[0]  # the same global weights, bit for bit
