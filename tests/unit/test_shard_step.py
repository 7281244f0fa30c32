"""A parameter-server shard in-process (master/shards/shard.py `Shard`): its receipts, the versions
it applies in order only, and what it refuses. That a push through the shards is the master's own
step, and a dqn run's target network, are tests/service/test_shards.py's."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save as st_save

from a3c_http.algos.registry import model_for, train_config
from a3c_http.optim.flatnet import FlatNetwork
from a3c_http.wire.tensors import Layout
from master.shards.coordinator import slices
from master.shards.shard import OPENING, Refused, Shard, receipt

CONFIG = train_config(algo="a3c", seed=3, shards=2)


def opened(net: FlatNetwork, lo: int, hi: int, version: int = 5) -> Shard:
    shard = Shard()
    meta = {
        "config": CONFIG.model_dump(mode="json"), "index": 1, "lo": lo, "hi": hi,
        "version": version, "epoch": "e1", "key": "00" * 32,
    }  # fmt: skip
    body = st_save({"weights": net.params.detach()[lo:hi].clone()}, {OPENING: json.dumps(meta)})
    shard.open(body)
    return shard


def slice_body(vector: torch.Tensor) -> bytes:
    return Layout([("slice", (vector.numel(),))], vector.numel()).encode(vector)


def test_slices_cover_the_vector_in_nearly_equal_parts() -> None:
    assert slices(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert slices(9155, 16)[-1][1] == 9155


def test_a_stage_is_receipted_and_a_batch_sent_again_is_passed_over() -> None:
    net = FlatNetwork(model_for(CONFIG), CONFIG)
    n = net.layout.n_params
    lo, hi = n // 3, n // 2
    shard = opened(net, lo, hi)
    gradient = torch.randn(hi - lo) * 1e-3
    staged = shard.stage("w1", 1, "e1", slice_body(gradient))
    assert staged["sumsq"] == pytest.approx(float(torch.dot(gradient, gradient)), rel=1e-5)
    assert staged["receipt"] == receipt(bytes(32), "e1", 1, "w1", 1, staged["sumsq"])
    decision = {"version": 6, "worker": "w1", "seq": 1, "lr": CONFIG.lr}
    assert shard.apply("e1", [decision]) == 6
    applied = shard.weights(6, wait_s=0)[0]
    assert shard.apply("e1", [{**decision, "lr": 1.0}]) == 6  # not applied twice
    assert shard.weights(6, wait_s=0)[0] == applied


@pytest.mark.parametrize(
    ("decision", "why"),
    [
        ({"version": 7, "worker": "w1", "seq": 1}, "a gap"),
        ({"version": 6, "worker": "w2", "seq": 1}, "not staged"),
    ],
)
def test_a_gap_or_a_push_not_staged_fails_the_shard(decision: dict, why: str) -> None:
    net = FlatNetwork(model_for(CONFIG), CONFIG)
    shard = opened(net, 0, 100)
    shard.stage("w1", 1, "e1", slice_body(torch.zeros(100)))
    with pytest.raises(Refused, match=why):
        shard.apply("e1", [{**decision, "lr": 1e-3}])
    assert shard.version == 5
    with pytest.raises(Refused) as failed:  # it takes nothing more until the master resets it
        shard.stage("w1", 2, "e1", slice_body(torch.zeros(100)))
    assert failed.value.status == 503


def test_what_a_shard_refuses_to_stage() -> None:
    net = FlatNetwork(model_for(CONFIG), CONFIG)
    shard = opened(net, 0, 100)
    with pytest.raises(Refused, match="epoch 'e0' is over") as old:
        shard.stage("w1", 1, "e0", slice_body(torch.zeros(100)))
    assert old.value.status == 409
    for bad in (torch.zeros(99), torch.full((100,), float("nan")), torch.full((100,), 3e38)):
        with pytest.raises(Refused) as refused:
            shard.stage("w1", 1, "e1", slice_body(bad))
        assert refused.value.status == 422
    assert shard.status()["staged"] == 0
    with pytest.raises(Refused, match="holds no run"):
        Shard().stage("w1", 1, "e1", slice_body(torch.zeros(100)))


def test_what_a_shard_holds_staged_is_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("master.shards.shard.MAX_STAGED_BYTES", 4 * 100 * 3)  # 3 slices of 100
    net = FlatNetwork(model_for(CONFIG), CONFIG)
    shard = opened(net, 0, 100)
    for seq in (1, 2, 3):
        shard.stage("w1", seq, "e1", slice_body(torch.zeros(100)))
    shard.stage("w1", 3, "e1", slice_body(torch.zeros(100)))  # the same push again: taken
    with pytest.raises(Refused, match="3 pushes staged already") as full:
        shard.stage("w1", 4, "e1", slice_body(torch.zeros(100)))
    assert full.value.status == 503 and shard.status()["staged"] == 3
