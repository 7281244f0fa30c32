"""The target network of a dqn run on the master (master/learning/target.py): served by its own
version, refreshed every `target_update` applied updates, saved and taken up again with the run.
In-process (TestClient)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from safetensors.torch import load as st_load

from a3c_http.wire import tensors as wire
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import (
    gradients_like,
    make_settings,
    master,
    push_gradients,
    start_run,
    weights,
)
from tests.support.master_api import launched as launched


def _target(c: TestClient, if_not: int | None = None):
    headers = {"If-None-Match": f'"{if_not}"'} if if_not is not None else {}
    return c.get("/target_model_weights", headers=headers)


def test_an_a3c_run_has_no_target_network(tmp_path: Path, launched: list) -> None:
    with master(make_settings(tmp_path)) as c:
        start_run(c)
        r = _target(c)
        assert r.status_code == 409 and "algo 'dqn' and 'apex'" in r.json()["detail"]


def test_the_target_follows_every_target_update_versions_and_is_saved_with_the_run(
    tmp_path: Path, launched: list
) -> None:
    settings = make_settings(tmp_path)
    with master(settings) as c:
        start_run(c, algo="dqn", target_update=3, hidden_sizes=[8])
        c.post("/worker_started", json={"worker_id": "w1", "url": "http://127.0.0.1:9001"})
        tensors, first, body = weights(c)
        r = _target(c)
        assert int(r.headers["X-Model-Version"]) == first and r.content == body
        for step in range(1, 4):
            tensors, version, _ = weights(c)
            grads = wire.encode(gradients_like(tensors))
            assert push_gradients(c, grads, version).status_code == 200
            if step < 3:  # not yet 3 versions past it: unchanged
                assert _target(c, first).status_code == 304
        _, now, body = weights(c)
        r = _target(c, first)
        assert r.status_code == 200 and int(r.headers["X-Model-Version"]) == now == first + 3
        assert r.content == body and st_load(r.content).keys() == tensors.keys()
        assert c.get("/status").json()["target_version"] == now
        tensors, version, _ = weights(c)  # one more: the weights move on, the target stays
        assert push_gradients(c, wire.encode(gradients_like(tensors)), version).status_code == 200
        assert weights(c)[1] == now + 1

    with master(settings) as c:  # a new master on the folder: the target as it was saved
        r = _target(c)
        assert int(r.headers["X-Model-Version"]) == now and r.content == body
        assert weights(c)[2] != body
