"""The staleness-aware step (staleness_scaling, a3c_http/algos/a3c/algorithm.py `lr_scale`) and the
bound that still refuses what is too old, on the parameter server itself (unit: no HTTP)."""

from __future__ import annotations

import pytest
import torch

from a3c_http.algos.registry import model_for, train_config
from a3c_http.config.training import TrainConfig
from master.errors import StateConflict
from master.learning.admission import RunLimits
from master.learning.parameter_server import ParameterServer


def server(**config: object) -> tuple[ParameterServer, TrainConfig]:
    cfg = train_config(seed=1, max_steps=None, **config)
    params = ParameterServer()
    params.start_run(cfg, model_for(cfg), next_version=False)
    return params, cfg


def grads(params: ParameterServer, seed: int) -> torch.Tensor:
    """A gradient vector whose norm (about 0.1) is within the default max_grad_norm."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(params.net.layout.numel, generator=generator) * 1e-3


def push(params: ParameterServer, cfg: TrainConfig, version: int, vector: torch.Tensor) -> None:
    update = params.checked_update("w1", version, vector, cfg, RunLimits.of(cfg))
    params.apply_gradients(update, cfg, None)


@pytest.mark.parametrize(
    ("scaling", "shares"), [("inverse", [1, 1, 1 / 2, 1 / 3]), ("none", [1, 1, 1, 1])]
)
def test_an_update_s_versions_old_moves_the_weights_by_one_s_th(
    scaling: str, shares: list[float]
) -> None:
    """With plain SGD at lr=1 an update moves the weights by exactly minus its gradients times
    the share of the learning rate it got: 1 / staleness with inverse (at least 1: a gradient of
    the current weights takes the full step), the full step with none."""
    params, cfg = server(staleness_scaling=scaling)
    params.net.optimizer = torch.optim.SGD([params.net.params], lr=1.0)
    for staleness, share in enumerate(shares):  # each computed on version 0
        vector = grads(params, staleness)
        before = params.net.flat.clone()
        push(params, cfg, 0, vector)
        assert params.version == staleness + 1
        moved = params.net.flat - before
        assert torch.allclose(moved, -share * vector, rtol=0, atol=1e-7), staleness
    assert params.net.optimizer.param_groups[0]["lr"] == 1.0  # only those steps were scaled
    assert params.counters()["staleness_mean"] == sum(range(4)) / 4


def test_the_learning_rate_is_scaled_not_the_gradient_rmsprops_average_sees() -> None:
    """RMSprop divides by the root of its average of squared gradients: the scaled update is
    the step of lr / s with the gradient as computed, which a gradient divided by s is not (its
    smaller square would shrink the average that divides it)."""
    params, cfg = server(staleness_scaling="inverse")
    reference = model_for(cfg)
    reference.load_state_dict(params.model.state_dict())
    flat = torch.nn.Parameter(torch.cat([p.detach().reshape(-1) for p in reference.parameters()]))
    optimizer = torch.optim.RMSprop([flat], lr=cfg.lr, alpha=0.99, eps=1e-5)
    divided = torch.optim.RMSprop([flat_copy := flat.detach().clone()], lr=cfg.lr, eps=1e-5)
    flat_copy.requires_grad_(True)
    for staleness in range(4):
        vector = grads(params, staleness)
        push(params, cfg, 0, vector)
        share = 1 / max(1, staleness)
        optimizer.param_groups[0]["lr"] = cfg.lr * share
        flat.grad = vector.clone()
        optimizer.step()
        flat_copy.grad = vector * share  # what scaling the gradient would have done
        divided.step()
    n = params.net.layout.n_params
    assert torch.allclose(params.net.flat[:n], flat.detach(), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(params.net.flat[:n], flat_copy.detach(), rtol=1e-5, atol=1e-7)


def test_gradients_older_than_max_staleness_are_still_refused_with_scaling() -> None:
    params, cfg = server(staleness_scaling="inverse", max_staleness=2)
    for _ in range(3):
        push(params, cfg, params.version, grads(params, 0))
    before = params.net.flat.clone()
    with pytest.raises(StateConflict, match=r"3 versions old \(max_staleness=2\)"):
        push(params, cfg, 0, grads(params, 1))
    assert torch.equal(params.net.flat, before) and params.version == 3
    assert params.counters()["updates_rejected_by"] == {"stale": 1}
    push(params, cfg, 1, grads(params, 2))  # 2 versions old: at the bound, taken
    assert params.version == 4
