"""What a worker may not decide: the checks on gradients, statistics, reports and registrations
that keep one crafted request from damaging a run (issue 17). Unit tests of the pieces, and their
HTTP face through TestClient: a refused request is a 4xx that names the problem and counts
nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from a3c_http.algos.registry import model_for, train_config
from a3c_http.config.settings import Settings
from a3c_http.models.normalize import batch_problem
from a3c_http.optim.flatnet import FlatNetwork, NonFiniteStep, _bounded
from master.app import create_app
from master.learning.admission import RunLimits, gradient_problem
from tests.support.common import OCTET, master_running, push_rollout, snapshot

NORMALIZED = train_config(seed=1, max_steps=None, normalize_obs=True, normalize_reward=True)


def moments(mean: float = 0.0, var: float = 1.0, count: float = 40.0) -> dict[str, torch.Tensor]:
    """The batch moments of a rollout's observations (and returns) as a push carries them."""
    return {
        "obs_rms.mean": torch.full((4,), mean),
        "obs_rms.var": torch.full((4,), var),
        "obs_rms.count": torch.tensor(count),
        "ret_rms.mean": torch.tensor(0.0),
        "ret_rms.var": torch.tensor(1.0),
        "ret_rms.count": torch.tensor(count),
    }


@pytest.mark.parametrize(
    ("batch", "named"),
    [
        (moments(count=-1.0), "obs_rms.count is -1"),
        (moments(count=1e30), "obs_rms.count is 1e+30"),  # would freeze the statistics for ever
        (moments(var=-1e30), "obs_rms.var holds a negative variance"),
        (moments(mean=1e30), "its var leave float32's range"),
    ],
)
def test_batch_moments_a_rollout_cannot_have_are_refused(batch: dict, named: str) -> None:
    model = model_for(NORMALIZED)
    assert batch_problem(model, moments(), max_count=40) is None
    assert named in batch_problem(model, batch, max_count=40)


def test_a_step_that_would_leave_anything_non_finite_is_undone() -> None:
    # Gradients of 3e38 square to inf in RMSprop's square_avg (what one push did once).
    config = train_config(seed=1, max_steps=None)
    net = FlatNetwork(model_for(config), config)
    before = net.flat.clone()
    with pytest.raises(NonFiniteStep, match="the optimizer's square_avg"):
        net.step([torch.full((net.layout.numel,), 3e38)])
    assert torch.equal(net.flat, before) and not net.optimizer.state  # as before the first step
    net.step([torch.full((net.layout.numel,), 1e-3)])
    square_avg = net.optimizer.state[net.params]["square_avg"].clone()
    with pytest.raises(NonFiniteStep):
        net.step([torch.full((net.layout.numel,), 3e38)])
    assert torch.equal(net.optimizer.state[net.params]["square_avg"], square_avg)
    assert int(net.optimizer.state[net.params]["step"]) == 1


@pytest.mark.parametrize(
    ("wire_dtype", "above", "taken"),
    [
        # Values just above a bfloat16 tie round up: the norm grows by 0.385%.
        ("bfloat16", 1.0, True),
        ("float32", 1.0, False),  # the same rounded gradients, in a run that sends float32
        ("bfloat16", 1.0015, False),  # 0.535%: beyond what rounding can add (0.1% and 2**-8)
    ],
)
def test_the_norm_bound_allows_bfloat16s_rounding_and_no_more(
    wire_dtype: str, above: float, taken: bool
) -> None:
    """A worker clips its gradients to max_grad_norm, then each value is rounded to bfloat16;
    the master judges the norm of what it decoded."""
    bf16 = train_config(seed=1, max_steps=None, wire_dtype="bfloat16")
    net = FlatNetwork(model_for(bf16), bf16)
    clipped = torch.full((net.layout.numel,), 2.0**-10 * (1 + 1.01 * 2.0**-8))
    max_grad_norm = float(torch.linalg.vector_norm(clipped)) / above
    decoded, _ = net.wire.decode(net.wire.encode(clipped))
    assert float(torch.linalg.vector_norm(decoded)) / max_grad_norm > 1.0038 * above
    config = bf16.model_copy(update={"max_grad_norm": max_grad_norm, "wire_dtype": wire_dtype})
    judge = FlatNetwork(model_for(config), config)
    _, why = gradient_problem(judge, decoded, config, RunLimits.of(config))
    assert (why is None) == taken, why
    if not taken:
        assert why.startswith("the gradients' norm is") and "above max_grad_norm" in why


def test_a_step_known_finite_skips_the_undo_and_one_that_is_not_keeps_it() -> None:
    """A checked gradient's step on finite weights far from float32's limit is known finite
    (a3c_http/optim/flatnet.py): no undo buffers, no check; near the limit, or for an optimizer the
    bound does not cover, the step keeps both."""
    config = train_config(seed=1, max_steps=None)
    net = FlatNetwork(model_for(config), config)
    vector = torch.full((net.layout.numel,), 1e-3)
    weight_bound = net.weight_bound
    net.step([vector], checked_norm=net.gradient_norm(vector))
    assert net._spare == [] and net.weight_bound == pytest.approx(weight_bound + 100 * config.lr)
    net.step([vector])  # an unchecked gradient: the undo is ready
    assert net._spare
    near = net.flat.clone()
    near[: net.layout.n_params] = 1e38
    net.load(near)
    net._spare = []
    net.step([vector], checked_norm=net.gradient_norm(vector))
    assert net._spare and net.weight_bound >= 1e38 * 0.999
    assert FlatNetwork(model_for(config), config.model_copy(update={"optimizer": "adam"}))._bounded
    net.optimizer = torch.optim.SGD([net.params], lr=0.1, momentum=0.9)
    assert not _bounded(net.optimizer)


def test_a_push_of_impossible_statistics_is_422_and_counts_nothing(tmp_path: Path) -> None:
    """The push that once bricked the run folder: obs_rms.var -1e30 and count 1e30."""
    with master_running(tmp_path, normalize_obs=True, normalize_reward=True) as c:
        layout = c.app.state.cluster.params.net.layout
        ledger = c.app.state.cluster.ledger
        before, seen = snapshot(c), ledger.workers.get("w1").last_seen
        vector = torch.zeros(layout.numel)
        vector[: layout.n_params] = 1e-3
        views = layout.views(vector)
        views["obs_rms.var"].fill_(-1e30)
        views["obs_rms.count"].fill_(1e30)
        metadata = {"a3c": json.dumps({"episodes": [[20.0, 20]], "stats": None})}
        headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": "0", "X-A3C-Seq": "1"}
        r = c.post("/gradients", content=layout.encode(vector, metadata), headers=headers)
        assert r.status_code == 422
        assert "obs_rms.count is 1e+30" in r.json()["detail"]
        assert snapshot(c) == before  # the episode it carried is not counted either
        assert ledger.workers.get("w1").last_seen == seen  # not a sign of life
        assert c.get("/status").json()["updates_rejected_by"] == {"invalid": 1}


def test_only_registered_workers_take_part(tmp_path: Path) -> None:
    """A stranger's heartbeat claiming 9e18 env steps once ended the run (max_steps)."""
    with master_running(tmp_path, max_steps=2_000_000) as c:
        before = snapshot(c)
        for path, body in [
            ("/heartbeat", {"worker_id": "stranger", "env_steps": 10**15}),
            ("/episode", {"worker_id": "stranger", "reward": 500.0, "length": 500}),
            ("/worker_done", {"worker_id": "stranger"}),
        ]:
            r = c.post(path, json=body)
            assert r.status_code == 409, path
            assert "'stranger' is not registered" in r.json()["detail"]
            assert r.headers["X-A3C-Stop"] == "1"
        assert push_rollout(c, 1, [[10.0, 10]], worker="stranger").status_code == 409
        assert snapshot(c) == before
        r = c.post("/worker_started", json={"worker_id": "stranger"})  # joining is open
        assert r.status_code == 200 and push_rollout(c, 1, worker="stranger").status_code == 200


@pytest.mark.parametrize(
    ("send", "named"),
    [
        ("episodes", "41 episodes in one rollout"),
        ("length", "an episode of 501 steps"),
        ("return", "reward: Input should be less than or equal to 1000000000"),
        ("env_steps", "env_steps 1000000000000000:"),
    ],
)
def test_an_implausible_report_is_422_and_counts_nothing(
    tmp_path: Path, send: str, named: str
) -> None:
    # CartPole-v1: t_max 5 x num_envs 8 = 40 steps a rollout, episodes of at most 500 steps.
    with master_running(tmp_path) as c:
        before = snapshot(c)
        if send == "episodes":
            r = push_rollout(c, 1, [[10.0, 10]] * 41)
        elif send == "length":
            r = c.post("/episode", json={"worker_id": "w1", "reward": 1.0, "length": 501})
        elif send == "return":
            r = c.post("/episode", json={"worker_id": "w1", "reward": 1e308, "length": 10})
        else:
            r = c.post("/heartbeat", json={"worker_id": "w1", "env_steps": 10**15})
        assert r.status_code == 422
        assert named in r.json()["detail"]
        assert snapshot(c) == before
        assert c.get("/status").json()["state"] == "running"


def test_the_registry_is_bounded(tmp_path: Path) -> None:
    settings = Settings(run_dir=tmp_path / "run", workers_file=tmp_path / "w.txt", max_workers=3)
    with TestClient(create_app(settings), client=("127.0.0.1", 50000)) as c:
        c.app.state.cluster.start_run(train_config(seed=1), ["http://127.0.0.1:9001"])
        for worker_id in ("w1", "a", "b", "a"):  # w1 was started: "a" and "b" fill the registry
            assert c.post("/worker_started", json={"worker_id": worker_id}).status_code == 200
        r = c.post("/worker_started", json={"worker_id": "c"})
        assert r.status_code == 409
        assert "A3C_MAX_WORKERS" in r.json()["detail"]
        assert len(c.get("/status").json()["workers"]) == 3


def test_a_temporary_slot_keeps_the_weights_without_their_metadata(tmp_path: Path) -> None:
    # Ten slots of 30 MiB of metadata each once made run.db 300 MiB.
    with master_running(tmp_path) as c:
        params = c.app.state.cluster.params
        body, _ = params.weights()
        layout = params.net.layout
        padded = layout.encode(torch.from_numpy(layout.decode(body)[0].numpy()), {"x": "y" * 10**6})
        r = c.post(
            "/local_model_weights?worker_id=w1&temporary=true", content=padded, headers=OCTET
        )
        assert r.status_code == 200, r.text
        assert params.temporary["w1"] == body  # the weights as this master encodes them


@pytest.mark.parametrize(
    ("value", "named"),
    [(3e38, "outputs for plain observations are not finite"), (-1.0, "count is negative")],
)
def test_global_weights_that_cannot_be_used_are_422(
    tmp_path: Path, value: float, named: str
) -> None:
    # 3e38 everywhere once replaced the global weights: a worker then failed on inf probabilities.
    with master_running(tmp_path, normalize_obs=True) as c:
        layout = c.app.state.cluster.params.net.layout
        vector = torch.full((layout.numel,), 0.1)
        if value < 0:
            layout.views(vector)["obs_rms.count"].fill_(value)
        else:
            vector[: layout.n_params] = value
        before = snapshot(c)
        r = c.post(
            "/local_model_weights?worker_id=w1&temporary=false",
            content=layout.encode(vector),
            headers=OCTET,
        )
        assert r.status_code == 422
        assert named in r.json()["detail"]
        assert snapshot(c) == before
