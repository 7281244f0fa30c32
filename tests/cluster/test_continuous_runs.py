"""The off-policy algorithms of continuous actions on real processes: a SAC run's learner trains
from the actors' replay and the master saves its state (its optimizers, the entropy coefficient's,
the target critics) in the run folder; an Ape-X DPG run's actors, each with its own noise, feed the
learner's prioritized replay. A learner that starts again from that state, and the master's check
of it: tests/unit/test_continuous.py; a learner's saved state handed to the resumed run's learner
after kill -9 of the master: tests/cluster/test_apex_runs.py."""

from __future__ import annotations

import io
import math

import pytest
import torch

from a3c_http.local.cluster import LocalCluster, wait_for
from a3c_http.store.runstore import RunStore

pytestmark = pytest.mark.integration

SMALL = {
    "env_id": "Pendulum-v1",
    "seed": 5,
    "max_steps": None,
    "target_return": 1e9,
    "heartbeat_timeout_s": 30,
    "hidden_sizes": [32, 32],
    "batch_size": 32,
    "learning_starts": 64,
    "t_max": 8,
    "gradient_steps": 8,
    "eval_every_updates": None,
    "solved_on": "train",
    # One thread: the presets' spinning learner threads (master/learning/learner_needs.py) only
    # wait for each other on a machine that the other tests keep busy.
    "learner_threads": 1,
}


def saved_learner_state(cluster: LocalCluster) -> dict:
    blob = RunStore(cluster.run_dir).load().optimizer
    return torch.load(io.BytesIO(blob or b""), weights_only=True) if blob else {}


def test_a_sac_run_learns_and_the_master_saves_its_learners_state(
    cluster: LocalCluster,
) -> None:
    workers = [w.url for w in cluster.workers[:2]]
    assert cluster.train(**SMALL, algo="sac", workers=workers).status_code == 202
    learning = wait_for(
        lambda: (m := cluster.status()["learner"]["metrics"]) and m.get("train/ent_coef", 1) < 0.95
        and m,
        120, "the learner to tune its entropy coefficient",
    )  # fmt: skip
    assert {"train/actor_loss", "train/critic_loss", "train/ent_coef"} <= set(learning)
    saved = wait_for(
        lambda: (s := saved_learner_state(cluster)) and "log_alpha" in s
        and float(s["log_alpha"]) < math.log(0.95) and s,
        60, "a save of the learner's state",
    )  # fmt: skip
    assert set(saved["optimizers"]) == {"actor", "critic", "alpha"}
    assert torch.isfinite(saved["target"]).all()
    assert cluster.stop_run()


def test_an_apex_dpg_run_feeds_its_prioritized_replay_from_actors_of_their_own_noise(
    cluster: LocalCluster,
) -> None:
    workers = [w.url for w in cluster.workers[:2]]
    body = {**SMALL, "algo": "apex_dpg", "twin_critics": True, "policy_delay": 2}
    assert cluster.train(**body, workers=workers).status_code == 202
    learning = wait_for(
        lambda: (m := cluster.status()["learner"]["metrics"]).get("replay/size", 0) >= 64 and m,
        120, "the replay to fill and the learner to step",
    )  # fmt: skip
    assert {"train/actor_loss", "train/critic_loss"} <= set(learning)
    noises = sorted(w["exploration"]["epsilon"] for w in cluster.status()["workers"])
    assert noises[0] < noises[1] == pytest.approx(0.3)  # the first actor's is dpg_noise's
    assert cluster.stop_run()
