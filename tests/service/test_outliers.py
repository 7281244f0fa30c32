"""Refusing outlier updates (Gorila): unit tests of the parameter server's check, and its HTTP
face (the 409, the optional headers and their validation) through TestClient."""

from __future__ import annotations

import io
import math
import random
import re
import statistics
from pathlib import Path

import pytest
import torch

from a3c_http.algos.registry import model_for, train_config
from a3c_http.config.training import TrainConfig
from a3c_http.wire import tensors as wire
from master.errors import Invalid, StateConflict
from master.learning.admission import WINDOW, RunLimits, Window
from master.learning.parameter_server import ParameterServer
from tests.support.common import OCTET, master_running, snapshot

CONFIG = train_config(seed=1, max_steps=None)
LIMITS = RunLimits.of(CONFIG)


def server(config: TrainConfig = CONFIG) -> ParameterServer:
    params = ParameterServer()
    params.start_run(config, model_for(config), next_version=False)
    return params


def grads_of(params: ParameterServer, scale: float = 1e-3) -> torch.Tensor:
    """A gradient vector as a decoded body is (a3c_http/optim/flatnet.py); the default scale gives a
    norm of 0.1, within max_grad_norm (0.5)."""
    return torch.full((params.net.layout.numel,), scale)


def push(
    params: ParameterServer,
    norm: float | None,
    loss: float | None = None,
    config: TrainConfig = CONFIG,
    scale: float = 1e-3,
    worker: str = "w1",
):
    vector = grads_of(params, scale)
    update = params.checked_update(
        worker, params.version, vector, config, LIMITS, loss=loss, norm=norm
    )
    return params.apply_gradients(update, config, refusal=None)


def steady(
    params: ParameterServer,
    n: int,
    config: TrainConfig = CONFIG,
    seed: int = 0,
    worker: str = "w1",
) -> None:
    """`n` updates as a healthy run sends them: log-normal norms, losses spread around 1."""
    rng = random.Random(seed)
    for _ in range(n):
        push(params, math.exp(rng.gauss(0.0, 0.5)), rng.gauss(1.0, 0.3), config, worker=worker)


def test_a_steady_stream_is_accepted() -> None:
    params = server()
    steady(params, 300)
    counters = params.counters()
    assert (counters["updates_applied"], counters["updates_rejected"]) == (300, 0)
    assert counters["updates_refused_outlier"] == 0


def test_a_1000x_norm_is_refused_and_counted_and_nothing_applied() -> None:
    params = server()
    steady(params, 60)
    before = params.weights()
    with pytest.raises(StateConflict) as refused:
        push(params, 1000.0, 1.0)
    detail = str(refused.value)
    assert "gradient norm 1000 " in detail
    assert "outlier_sigma=6" in detail
    for word in ("mean", "std", "threshold"):
        assert word in detail
    assert not refused.value.stop  # the worker pulls the weights and goes on
    assert params.weights() == before  # no step, no new version
    counters = params.counters()
    assert (counters["updates_applied"], counters["updates_rejected"]) == (60, 1)
    assert counters["updates_refused_outlier"] == 1
    # Only a norm far above the usual is refused; the run goes on with healthy updates.
    push(params, 0.001, 1.0)
    assert params.counters()["updates_applied"] == 61


@pytest.mark.parametrize("loss", [1e4, -1e4])
def test_a_loss_far_larger_than_the_windows_of_either_sign_is_refused(loss: float) -> None:
    params = server()
    steady(params, 60)
    with pytest.raises(StateConflict, match=re.escape(f"loss {loss:.4g} refused as an outlier")):
        push(params, 1.0, loss)
    assert params.counters()["updates_refused_outlier"] == 1


def test_a_loss_that_moves_as_a_run_learns_is_not_refused() -> None:
    # The size of a loss is judged: the policy loss changes sign between updates and the value
    # loss grows with the returns; neither is divergence.
    params = server()
    steady(params, 60)
    for loss in (-0.8, 1e-9, 0.0, 3.0, -2.5):
        push(params, 1.0, loss)
    assert params.counters()["updates_refused_outlier"] == 0


def test_the_check_waits_for_the_warmup() -> None:
    config = CONFIG.model_copy(update={"outlier_warmup": 20})
    early = server(config)
    steady(early, 19, config)
    push(early, 1000.0, 1.0, config)  # 19 updates are no window to judge by yet
    assert early.counters()["updates_refused_outlier"] == 0
    judged = server(config)
    steady(judged, 20, config)
    with pytest.raises(StateConflict, match="outlier"):
        push(judged, 1000.0, 1.0, config)


def test_the_check_is_off_when_outlier_sigma_is_none() -> None:
    config = CONFIG.model_copy(update={"outlier_sigma": None})
    params = server(config)
    steady(params, 60, config)
    push(params, 1e6, 1e6, config)
    counters = params.counters()
    assert (counters["updates_applied"], counters["updates_refused_outlier"]) == (61, 0)


def test_the_norm_judged_is_the_larger_of_the_reported_and_the_received() -> None:
    # The reported norm (before clipping) is a hint: it can make an update an outlier, never hide
    # one. A client that reports nothing, or a tiny norm, is judged on what arrived.
    params = server()
    for _ in range(60):
        push(params, None, scale=1e-5)  # a received norm of 1e-3
    for reported in (None, 1e-6):
        with pytest.raises(StateConflict, match="gradient norm"):
            push(params, reported, scale=5e-3)  # 0.48: within max_grad_norm, 500 times the usual


def test_gradients_beyond_max_grad_norm_are_refused_from_the_first_update() -> None:
    """Workers clip to max_grad_norm before they send, so more is not a gradient of theirs: it is
    refused whatever norm is reported, before any window exists (3e38 everywhere once made
    RMSprop's state infinite and froze the run)."""
    params = server()
    before = params.weights()
    for scale in (3e38, 0.01):  # a norm of inf in float32, and of 0.96
        with pytest.raises(Invalid, match="above max_grad_norm=0.5"):
            push(params, 0.05, 1.0, scale=scale)
    assert params.weights() == before
    counters = params.counters()
    assert counters["updates_rejected_by"] == {"invalid": 2}
    assert (counters["updates_applied"], counters["updates_refused_outlier"]) == (0, 0)


def test_one_worker_cannot_move_the_window_that_judges_another() -> None:
    # 100 pushes of zero gradients from one client once pulled the one shared window so low that
    # the next 28 honest pushes of the others were refused as outliers.
    params = server()
    steady(params, 100, worker="w1")
    steady(params, 100, worker="x", seed=1)
    for _ in range(100):
        push(params, 0.0, 0.0, scale=0.0, worker="x")
    steady(params, 50, worker="w1", seed=2)
    assert params.counters()["updates_refused_outlier"] == 0
    with pytest.raises(StateConflict, match="outlier"):  # x moved its own window only
        push(params, 1.0, 1.0, worker="x")


def test_the_counter_and_the_window_are_saved_with_the_run() -> None:
    params = server()
    steady(params, 60)
    with pytest.raises(StateConflict):
        push(params, 1000.0)
    state, (_, optimizer) = params.state(), params.blobs()[:2]
    resumed = ParameterServer()
    optimizer_state = torch.load(io.BytesIO(optimizer), weights_only=True)
    resumed.restore(CONFIG, model_for(CONFIG), state, optimizer_state, {}, skip_versions=0)
    assert resumed.counters()["updates_refused_outlier"] == 1
    with pytest.raises(StateConflict, match="outlier"):  # judged at once: no second warm-up
        push(resumed, 1000.0)
    # A new run starts a new window and a new count.
    resumed.start_run(CONFIG, model_for(CONFIG), next_version=True)
    push(resumed, 1000.0)
    assert resumed.counters()["updates_refused_outlier"] == 0


# -- over HTTP ----------------------------------------------------------------------------------


def gradient_push(c, version: int, **headers: str):
    tensors = wire.decode(c.get("/global_model_weights").content, c.app.state.cluster.params.spec)
    body = wire.encode({name: torch.full_like(t, 1e-3) for name, t in tensors.items()})
    head = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": str(version), **headers}
    return c.post("/gradients", content=body, headers=head)


def test_an_outlier_push_is_409_without_stop_and_changes_nothing(tmp_path: Path) -> None:
    with master_running(tmp_path, outlier_warmup=5) as c:
        for version in range(5):
            r = gradient_push(c, version, **{"X-A3C-Loss": "0.5", "X-A3C-Grad-Norm": "2.0"})
            assert r.status_code == 200, r.text
        before = snapshot(c)
        r = gradient_push(c, 5, **{"X-A3C-Loss": "0.5", "X-A3C-Grad-Norm": "2000"})
        assert r.status_code == 409
        assert "gradient norm 2000 refused as an outlier" in r.json()["detail"]
        assert "X-A3C-Stop" not in r.headers
        assert snapshot(c) == before
        status = c.get("/status").json()
        assert (status["updates_rejected"], status["updates_refused_outlier"]) == (1, 1)


BAD_REPORTS = [
    ("X-A3C-Loss", "nan"),
    ("X-A3C-Loss", "-inf"),
    ("X-A3C-Loss", "low"),
    ("X-A3C-Grad-Norm", "inf"),
    ("X-A3C-Grad-Norm", "-1"),
    ("X-A3C-Grad-Norm", "1,5"),
]


def test_a_bad_reported_value_is_422_naming_the_header(tmp_path: Path) -> None:
    with master_running(tmp_path) as c:
        before = snapshot(c)
        for header, value in BAD_REPORTS:
            r = gradient_push(c, 0, **{header: value})
            assert r.status_code == 422, (header, value)
            assert header in r.json()["detail"], (header, value)
        assert snapshot(c) == before
        assert c.get("/status").json()["updates_rejected"] == 0
        good = {"X-A3C-Loss": "-0.25", "X-A3C-Grad-Norm": "0"}  # a loss may be negative
        assert gradient_push(c, 0, **good).status_code == 200


def test_a_level_that_really_moves_is_followed_not_refused_for_ever() -> None:
    # As when a CartPole agent first balances: the loss grows a hundredfold and stays there.
    params = server()
    steady(params, 100)
    refused = 0
    for _ in range(100):
        try:
            push(params, 1.0, 100.0)
        except StateConflict:
            refused += 1
    assert 0 < refused < 50
    push(params, 1.0, 100.0)  # the window has followed: the new level is usual now


def test_the_windows_running_sums_give_the_exact_mean_and_spread() -> None:
    """Past the window's size (old values leave the sums) and across the exact re-summing."""
    rng = random.Random(3)
    window, values = Window(), []
    for i in range(350):
        value = rng.gauss(2.0, 0.7) if i % 50 else rng.gauss(-40.0, 5.0)
        window.append(value)
        values = (values + [value])[-WINDOW:]
        mean, std = window.mean_std(floor=0.0)
        assert mean == pytest.approx(statistics.fmean(values), abs=1e-9)
        assert std == pytest.approx(statistics.pstdev(values), abs=1e-9)
    assert window.mean_std(floor=100.0)[1] == 100.0
