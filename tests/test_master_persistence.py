"""The master's persistence: a new master on the same run folder resumes the run as it was,
and one resumed after a crash never reuses a model version. In-process (TestClient and
ClusterState)."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load as st_load

from a3c_http import wire
from a3c_http.config import TrainConfig
from master.state import VERSIONS_SKIPPED_AFTER_A_CRASH, ClusterState, StateConflict
from tests.master_api_support import _clean_env as _clean_env
from tests.master_api_support import (
    episode,
    gradients_like,
    make_settings,
    master,
    push_gradients,
    start_run,
    status,
    weights,
)
from tests.master_api_support import launched as launched


def test_a_new_master_resumes_the_run(tmp_path: Path, launched: list) -> None:
    settings = make_settings(tmp_path)
    with master(settings) as c:
        start_run(c)
        c.post("/worker_started", json={"worker_id": "w1", "url": "http://127.0.0.1:9001"})
        for reward, length in ((10.0, 12), (30.0, 25), (20.0, 9)):
            episode(c, reward, length)
        tensors, version, _ = weights(c)
        assert push_gradients(c, wire.encode(gradients_like(tensors)), version).status_code == 200
        c.get("/queue")  # pop the oldest, so the FIFO no longer matches the episodes
        before = status(c)
        _, before_version, before_body = weights(c)
    assert before_version == 1

    with master(settings) as c:
        after = status(c)
        for key in (
            "state",
            "run_id",
            "env_id",
            "global_episode",
            "global_steps",
            "best_score",
            "moving_average",
            "mean_return_100",
            "model_version",
            "updates_applied",
            "updates_rejected",
            "queue_length",
            "queue_dropped",
            "config",
        ):
            assert after[key] == before[key], key
        assert after["state"] == "running"
        assert after["elapsed_s"] >= before["elapsed_s"]
        assert {
            w["worker_id"]: (w["state"], w["episodes"], w["steps"]) for w in after["workers"]
        } == {w["worker_id"]: (w["state"], w["episodes"], w["steps"]) for w in before["workers"]}
        _, version, body = weights(c)
        assert version == before_version
        assert body == before_body
        avg1 = 0.99 * 10.0 + 0.01 * 30.0
        avg2 = 0.99 * avg1 + 0.01 * 20.0
        assert c.get("/queue").json()["data"] == pytest.approx(avg1)
        assert c.get("/queue").json()["data"] == pytest.approx(avg2)
        assert c.get("/queue").json() == {"data": None, "empty": True}
        # The resumed run goes on: counters and versions continue from where they were.
        assert episode(c, 5.0)["global_episode"] == 4
        tensors = st_load(body)
        r = push_gradients(c, wire.encode(gradients_like(tensors)), version)
        assert r.status_code == 200
        assert r.headers["X-Model-Version"] == str(version + 1)


def test_a_master_resumed_after_a_crash_never_reuses_a_version(tmp_path: Path) -> None:
    """Versions handed out after the last save of a crashed master named weights that are lost:
    the resumed master skips past them (and saves that at once), so no version or ETag a worker
    holds from before the crash can name other weights. A clean shutdown skips nothing.
    (`close()` without a save is the crash: the process's end gives up the folder.)"""
    settings = make_settings(tmp_path)
    crashed = ClusterState(settings)
    crashed.start_run(TrainConfig(seed=1), ["http://127.0.0.1:9"])
    params = crashed.params
    grads = wire.encode(gradients_like(wire.decode(params.weights()[0], params.spec)))
    crashed.apply_gradients("w1", 0, grads)
    crashed.persist()  # a periodic save; then more versions, lost with the crash
    saved, _ = params.weights()
    for version in (1, 2):
        crashed.apply_gradients("w1", version, grads)
    assert params.version == 3
    crashed.close()

    resumed = ClusterState(settings)
    assert resumed.params.version == 1 + VERSIONS_SKIPPED_AFTER_A_CRASH
    assert resumed.params.weights() == (saved, resumed.params.version)  # the saved weights
    with pytest.raises(StateConflict, match="versions old"):
        resumed.apply_gradients("w1", 3, grads)  # computed on lost weights: refused
    resumed.close()
    # Crashing again right away skips again from the save the resumed master made at once.
    again = ClusterState(settings)
    assert again.params.version == 1 + 2 * VERSIONS_SKIPPED_AFTER_A_CRASH
    again.persist(force=True, clean=True)
    again.close()
    assert ClusterState(settings).params.version == again.params.version
