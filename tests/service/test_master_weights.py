"""The global weights through the master's API, in-process (TestClient): GET with
If-None-Match, gradients applied and answered with the new weights, stale gradients refused,
and local weights kept temporary or made global."""

from __future__ import annotations

from pathlib import Path

import torch
from fastapi.testclient import TestClient
from safetensors.torch import load as st_load

from a3c_http.wire import tensors as wire
from tests.support.common import master_running, push_rollout, snapshot
from tests.support.master_api import (
    OCTET,
    gradients_like,
    ones_like,
    push_gradients,
    start_run,
    status,
    weights,
)
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import client as client
from tests.support.master_api import launched as launched
from tests.support.master_api import running as running


def test_weights_need_a_run(client: TestClient) -> None:
    assert client.get("/global_model_weights").status_code == 409
    r = push_gradients(client, wire.encode({"x": torch.zeros(1)}), 0)
    assert r.status_code == 409


def test_global_model_weights_and_if_none_match(running: TestClient) -> None:
    tensors, version, _ = weights(running)
    assert version == 0
    assert "policy_torso.0.weight" in tensors and "value_head.bias" in tensors
    assert all(t.dtype == torch.float32 for t in tensors.values())
    r = running.get("/global_model_weights", headers={"If-None-Match": '"0"'})
    assert r.status_code == 304
    assert r.content == b""
    assert r.headers["X-Model-Version"] == "0"
    r = running.get("/global_model_weights", headers={"If-None-Match": '"7"'})
    assert r.status_code == 200 and r.headers["X-Model-Version"] == "0"


def test_gradients_apply_and_answer_new_weights(running: TestClient) -> None:
    before, version, _ = weights(running)
    r = push_gradients(running, wire.encode(gradients_like(before)), version)
    assert r.status_code == 200, r.text
    assert int(r.headers["X-Model-Version"]) == version + 1
    answered = st_load(r.content)
    after, new_version, _ = weights(running)
    assert new_version == version + 1
    for name in before:
        assert torch.equal(answered[name], after[name])
        assert not torch.equal(before[name], after[name]), name
        # Adam's first step moves every weight against the gradient's sign by about lr.
        assert torch.all(after[name] < before[name]), name
    s = status(running)
    assert (s["model_version"], s["updates_applied"], s["updates_rejected"]) == (1, 1, 0)
    r = running.get("/global_model_weights", headers={"If-None-Match": '"0"'})
    assert r.status_code == 200


def test_stale_gradients_are_409(client: TestClient, launched: list) -> None:
    start_run(client, max_staleness=1)
    tensors, _, _ = weights(client)
    grads = wire.encode(gradients_like(tensors))
    assert push_gradients(client, grads, 0).status_code == 200
    assert push_gradients(client, grads, 0).status_code == 200  # 1 version old: allowed
    _, version, body = weights(client)
    assert version == 2
    for stale in (0, 99):  # too old, and from a version this master never had
        r = push_gradients(client, grads, stale)
        assert r.status_code == 409, stale
        assert "version" in r.json()["detail"]
    _, after_version, after_body = weights(client)
    assert after_version == 2 and after_body == body
    s = status(client)
    assert (s["updates_applied"], s["updates_rejected"]) == (2, 2)


def test_local_weights_temporary_keeps_the_global_ones(running: TestClient) -> None:
    tensors, version, body = weights(running)
    r = running.post(
        "/local_model_weights?worker_id=w1&temporary=true",
        content=wire.encode(ones_like(tensors, 0.5)),
        headers=OCTET,
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {"model_version": version, "temporary": True, "duplicate": False}
    _, after_version, after_body = weights(running)
    assert after_version == version and after_body == body


def test_local_weights_become_global(running: TestClient) -> None:
    tensors, version, _ = weights(running)
    r = running.post(
        "/local_model_weights",
        params={"worker_id": "w2", "temporary": "false"},
        content=wire.encode(ones_like(tensors, 0.5)),
        headers=OCTET,
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {
        "model_version": version + 1,
        "temporary": False,
        "duplicate": False,
    }
    after, after_version, _ = weights(running)
    assert after_version == version + 1
    for name, t in after.items():
        assert torch.equal(t, torch.full_like(t, 0.5)), name
    assert status(running)["model_version"] == version + 1


def test_a_bfloat16_run_exchanges_bfloat16_and_keeps_float32(tmp_path: Path) -> None:
    """wire_dtype bfloat16: gradients are taken and weights served as bfloat16 (the statistics
    as float32), while the master's weights, optimizer and run folder stay float32; a float32
    body is refused, naming the dtype expected, and changes nothing."""
    with master_running(tmp_path, wire_dtype="bfloat16", normalize_obs=True) as c:
        cluster = c.app.state.cluster
        net = cluster.params.net
        before = snapshot(c)
        float32_body = net.layout.encode(torch.full((net.layout.numel,), 1e-3))
        r = push_gradients(c, float32_body, cluster.params.version)
        assert r.status_code == 422
        assert "has dtype float32, expected bfloat16" in r.json()["detail"]
        assert snapshot(c) == before

        r = push_rollout(c, 1)
        assert r.status_code == 200, r.text
        assert c.get("/global_model_weights").content == r.content
        served, kept = st_load(r.content), net.layout.views(net.flat)
        assert served["obs_rms.count"].dtype == torch.float32
        assert served["obs_rms.count"] == kept["obs_rms.count"]  # 1e-4 + 1e-3: not a bfloat16
        for name in dict(net.model.named_parameters()):
            assert served[name].dtype == torch.bfloat16, name
            assert torch.equal(served[name], kept[name].to(torch.bfloat16)), name
        # The master stepped float32 weights with a float32 optimizer: nothing of it is rounded.
        params = net.flat[: net.layout.n_params]
        assert net.flat.dtype == torch.float32
        assert not torch.equal(params, params.to(torch.bfloat16).to(torch.float32))
        assert net.optimizer.state[net.params]["square_avg"].dtype == torch.float32

        # A worker's weights follow the run's dtype too; its slot is kept as float32.
        r = c.post(
            "/local_model_weights?worker_id=w1&temporary=true", content=r.content, headers=OCTET
        )
        assert r.status_code == 200, r.text
        slot = wire.decode(cluster.params.temporary["w1"], net.layout.spec)
        assert torch.equal(slot["policy_head.weight"], served["policy_head.weight"].float())

        assert cluster.persist(force=True)
        saved = st_load((tmp_path / "run" / "weights.safetensors").read_bytes())
        assert all(t.dtype == torch.float32 for t in saved.values())
        assert torch.equal(net.layout.flatten(saved), net.flat)


def test_another_writers_gradients_are_applied_as_a_workers(tmp_path: Path) -> None:
    """POST /gradients takes the same gradients in any valid safetensors layout (here
    safetensors.torch.save of the tensors in reverse order, with the push's report) and applies
    them exactly as the worker's own layout; a broken one is refused and changes nothing."""
    from safetensors.torch import save as st_save

    from tests.support.common import OCTET

    answers = []
    for writer in ("layout", "safetensors"):
        with master_running(tmp_path / writer) as c:
            layout = c.app.state.cluster.params.net.wire
            vector = torch.full((layout.numel,), 1e-3)
            metadata = {"a3c": '{"episodes": [[12.0, 12]]}'}
            body = (
                layout.encode(vector, metadata)
                if writer == "layout"
                else st_save(dict(reversed(layout.views(vector).items())), metadata)
            )
            headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": "0", "X-A3C-Seq": "1"}
            before = snapshot(c)
            broken = body[:-4] + b"\x00\x00\xc0\x7f"  # a NaN in the last tensor
            refused = c.post("/gradients", content=broken, headers=headers)
            assert refused.status_code == 422 and "NaN" in refused.text, refused.text
            assert snapshot(c) == before
            r = c.post("/gradients", content=body, headers=headers)
            assert r.status_code == 200, r.text
            s = c.get("/status").json()
            answers.append((r.content, s["model_version"], s["global_episode"]))
    assert answers[0] == answers[1]
