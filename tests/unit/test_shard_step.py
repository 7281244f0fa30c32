"""A parameter-server shard in-process (master/shards/shard.py `Shard`): its step is the whole
network's step on its slice, it applies versions in order only, and what it refuses. The shards
as processes beside a master are tests/service/test_shards.py's."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load as st_load
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


def test_a_shards_steps_are_the_whole_networks_on_its_slice() -> None:
    torch.manual_seed(0)
    net = FlatNetwork(model_for(CONFIG), CONFIG)
    n = net.layout.n_params
    lo, hi = n // 3, n // 2
    shard = opened(net, lo, hi)
    for version, seq in ((6, 1), (7, 2)):
        gradient = torch.randn(n) * 1e-3
        staged = shard.stage("w1", seq, "e1", slice_body(gradient[lo:hi]))
        expected_sumsq = float(torch.dot(gradient[lo:hi], gradient[lo:hi]))
        assert staged["sumsq"] == pytest.approx(expected_sumsq, rel=1e-5)
        assert staged["receipt"] == receipt(bytes(32), "e1", 1, "w1", seq, staged["sumsq"])
        shard.apply("e1", [{"version": version, "worker": "w1", "seq": seq, "lr": CONFIG.lr}])
        net.step([gradient])
    body, version = shard.weights(7, wait_s=0)
    assert version == 7
    mine = Layout([("slice", (hi - lo,))], hi - lo).decode(body)[0]
    torch.testing.assert_close(mine, net.params.detach()[lo:hi])
    # A batch sent again is passed over, not applied twice.
    assert shard.apply("e1", [{"version": 7, "worker": "w1", "seq": 2, "lr": 1.0}]) == 7


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


def test_a_dqn_shards_target_slice_follows_the_masters_rule() -> None:
    config = train_config(algo="dqn", seed=3, shards=2)
    net = FlatNetwork(model_for(config), config)
    n = net.layout.n_params
    shard = Shard()
    meta = {
        "config": config.model_dump(mode="json"), "index": 0, "lo": 0, "hi": n, "version": 10,
        "epoch": "e1", "key": "00" * 32, "target_version": 9, "target_every": 3,
    }  # fmt: skip
    first = net.params.detach().clone()
    tensors = {"weights": first, "target": first.clone()}
    shard.open(st_save(tensors, {OPENING: json.dumps(meta)}))
    for version in (11, 12):
        shard.stage("w1", version, "e1", slice_body(torch.full((n,), 1e-3)))
        shard.apply("e1", [{"version": version, "worker": "w1", "seq": version, "lr": 1e-2}])
    saved = st_load(shard.state())
    assert shard.target_version == 12  # 12 - 9 >= 3: the weights of 12
    torch.testing.assert_close(saved["target"], saved["weights"])
    assert not torch.equal(saved["target"], first)
