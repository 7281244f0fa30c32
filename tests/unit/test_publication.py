"""What the parameter server does with a learner's publications (runs with a learner beside the
master), on the parameter server itself: the weights taken, the learner's optimizer state kept
as sent and saved, never loaded into an optimizer of the master's."""

from __future__ import annotations

import io
import math

import pytest
import torch

from a3c_http.algos.registry import model_for, train_config
from a3c_http.store.runstore import NonFiniteValue
from master.learning.parameter_server import ParameterServer


def _adam_state(numel: int) -> dict:
    """An Adam's state after one step over a flat vector of `numel`, as a learner sends it."""
    flat = torch.nn.Parameter(torch.zeros(numel))
    optimizer = torch.optim.Adam([flat], lr=1e-3, eps=1e-5)
    flat.grad = torch.full((numel,), 0.5)
    optimizer.step()
    return optimizer.state_dict()


def test_a_learners_optimizer_state_is_kept_as_sent_and_saved_and_no_optimizer_of_ours_loads_it(
) -> None:  # fmt: skip
    cfg = train_config(algo="ppo", optimizer="adam", seed=1, max_steps=None)
    params = ParameterServer()
    params.start_run(cfg, model_for(cfg), next_version=False)
    weights = params.net.snapshot() + 0.25
    state = _adam_state(params.net.layout.n_params)
    params.publish(3, weights, state)  # the master saw version 3 first: two updates between
    assert (params.version, params.updates_applied) == (3, 3)
    assert torch.equal(params.net.snapshot(), weights)
    assert params.net.optimizer.state_dict()["state"] == {}  # never loaded
    assert params.optimizer_state() is state
    _, blob, _ = params.blobs()
    saved = torch.load(io.BytesIO(blob), weights_only=True)
    assert torch.equal(saved["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    assert saved["param_groups"][0]["eps"] == 1e-5
    state["state"][0]["exp_avg_sq"][0] = math.nan  # the next one, broken: not saved
    params.publish(4, weights, state)
    with pytest.raises(NonFiniteValue, match="exp_avg_sq"):
        params.blobs()
