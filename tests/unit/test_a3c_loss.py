"""Known-answer tests of the A3C loss and its gradients: the loss terms against their
definitions on valid steps only, the entropy bonus, clipping, and the loss of a rollout."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from a3c_http.algos.a3c.algorithm import a3c_loss, compute_advantages
from a3c_http.algos.base import gradients
from a3c_http.algos.registry import train_config
from a3c_http.models.actor_critic import ActorCritic

# -- a3c_loss -------------------------------------------------------------------------------------


def loss_of(model: ActorCritic, obs: torch.Tensor, **rest: object) -> object:
    """a3c_loss of the model's policy and values over `obs` [T, N, ...] in time order."""
    dist, values = model.unroll(obs)
    return a3c_loss(dist, values, **rest)


def discrete_model(seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(obs_dim=4, action_dim=3, discrete=True, hidden_sizes=(16,))


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t, n = 4, 3
    valid = torch.ones(t, n, dtype=torch.bool)
    valid[1, 0] = valid[3, 2] = valid[0, 1] = False
    return {
        "obs": torch.randn(t, n, 4, generator=g),
        "actions": torch.randint(0, 3, (t, n), generator=g),
        "advantages": torch.randn(t, n, generator=g) * valid,
        "returns": torch.randn(t, n, generator=g) * valid,
        "valid": valid,
    }


def test_masked_steps_do_not_change_the_loss() -> None:
    model = discrete_model()
    b = batch()
    ref = loss_of(model, **b, value_coef=0.5, entropy_coef=0.01)
    invalid = ~b["valid"]
    changed = {k: v.clone() for k, v in b.items()}
    changed["obs"][invalid] = 1000.0
    changed["actions"][invalid] = (changed["actions"][invalid] + 1) % 3
    changed["advantages"][invalid] = 55.0
    changed["returns"][invalid] = -77.0
    other = loss_of(model, **changed, value_coef=0.5, entropy_coef=0.01)
    for name in ("total", "policy_loss", "value_loss", "entropy"):
        assert torch.allclose(getattr(ref, name), getattr(other, name), atol=1e-6), name
    # ...while changing a valid step does change it.
    changed["returns"][0, 0] += 1.0
    moved = loss_of(model, **changed, value_coef=0.5, entropy_coef=0.01)
    assert not torch.allclose(ref.value_loss, moved.value_loss)


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")
def test_loss_terms_match_their_definitions_on_valid_steps() -> None:
    model = discrete_model()
    b = batch()
    terms = loss_of(model, **b, value_coef=0.5, entropy_coef=0.01)
    mask = b["valid"].reshape(-1)
    obs = b["obs"].reshape(-1, 4)[mask]
    dist, values = model(obs)
    logp = dist.log_prob(b["actions"].reshape(-1)[mask])
    n = int(mask.sum())
    assert n == 9
    policy = -(logp * b["advantages"].reshape(-1)[mask]).sum() / n
    value = ((b["returns"].reshape(-1)[mask] - values) ** 2).sum() / n
    entropy = dist.entropy().sum() / n
    assert terms.policy_loss.item() == pytest.approx(policy.item(), abs=1e-6)
    assert terms.value_loss.item() == pytest.approx(value.item(), abs=1e-6)
    assert terms.entropy.item() == pytest.approx(entropy.item(), abs=1e-6)
    expected_total = policy + 0.5 * value - 0.01 * entropy
    assert terms.total.item() == pytest.approx(expected_total.item(), abs=1e-6)
    assert terms.total.requires_grad
    assert set(terms.as_floats()) == {
        "train/loss", "train/policy_loss", "train/value_loss", "train/entropy"
    }


def test_entropy_bonus_lowers_the_loss() -> None:
    model = discrete_model()
    b = batch()
    low = loss_of(model, **b, value_coef=0.5, entropy_coef=0.0)
    high = loss_of(model, **b, value_coef=0.5, entropy_coef=0.1)
    assert low.entropy.item() > 0
    assert high.total.item() < low.total.item()
    assert (low.total - high.total).item() == pytest.approx(0.1 * low.entropy.item(), rel=1e-5)


def test_entropy_gradient_pushes_towards_higher_entropy() -> None:
    # Minimising -entropy_coef * H with zero advantages and value_coef 0 must raise H.
    model = discrete_model()
    with torch.no_grad():
        model.policy_head.weight.mul_(100.0)  # start far from uniform
    b = batch()
    b["advantages"] = torch.zeros_like(b["advantages"])
    before = loss_of(model, **b, value_coef=0.0, entropy_coef=1.0)
    model.zero_grad()
    before.total.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.05 * p.grad
    after = loss_of(model, **b, value_coef=0.0, entropy_coef=1.0)
    assert after.entropy.item() > before.entropy.item()


def test_advantages_are_constants() -> None:
    model = discrete_model()
    b = batch()
    b["advantages"] = b["advantages"].clone().requires_grad_(True)
    terms = loss_of(model, **b, value_coef=0.5, entropy_coef=0.0)
    terms.total.backward()
    assert b["advantages"].grad is None


def test_all_invalid_raises() -> None:
    model = discrete_model()
    b = batch()
    b["valid"] = torch.zeros_like(b["valid"])
    with pytest.raises(ValueError, match="no valid step"):
        loss_of(model, **b, value_coef=0.5, entropy_coef=0.0)


def test_continuous_loss_runs() -> None:
    torch.manual_seed(0)
    model = ActorCritic.for_spaces(
        gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
        [8],
    )
    t, n = 3, 2
    valid = torch.ones(t, n, dtype=torch.bool)
    valid[1, 1] = False
    terms = loss_of(
        model, torch.randn(t, n, 3), actions=torch.randn(t, n, 2), advantages=torch.randn(t, n),
        returns=torch.randn(t, n), valid=valid, value_coef=0.5, entropy_coef=0.01,
    )
    assert torch.isfinite(terms.total)
    # Gaussian with sigma = 1 in 2 dims: H = log(2 pi e) = 2.8379...
    assert terms.entropy.item() == pytest.approx(float(np.log(2 * np.pi * np.e)), abs=1e-5)


# -- gradients ------------------------------------------------------------------------------------


def global_norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())))


def test_gradients_are_named_and_clipped() -> None:
    model = discrete_model()
    b = batch()
    # Unclipped norm of a large loss, to be sure clipping has work to do.
    big = 1000.0 * loss_of(model, **b, value_coef=0.5, entropy_coef=0.01).total
    model.zero_grad()
    big.backward(retain_graph=True)
    raw = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert global_norm(raw) > 10.0
    grads, norm = gradients(model, big, max_grad_norm=0.5)
    assert norm == pytest.approx(global_norm(raw), rel=1e-4)  # the norm before clipping
    assert set(grads) == {name for name, _ in model.named_parameters()}
    assert set(grads) == set(model.state_dict())
    for name, p in model.named_parameters():
        assert grads[name].shape == p.shape
    assert global_norm(grads) <= 0.5 + 1e-5
    # Clipping scales every gradient by one factor: the direction is kept.
    scale = global_norm(grads) / global_norm(raw)
    for name in grads:
        assert torch.allclose(grads[name], raw[name] * scale, atol=1e-6, rtol=1e-4)


def test_small_gradients_are_not_scaled() -> None:
    model = discrete_model()
    b = batch()
    loss = 1e-3 * loss_of(model, **b, value_coef=0.5, entropy_coef=0.0).total
    model.zero_grad()
    loss.backward(retain_graph=True)
    raw = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert global_norm(raw) < 0.5
    grads, _ = gradients(model, loss, max_grad_norm=0.5)
    for name in grads:
        assert torch.allclose(grads[name], raw[name])


def test_unreached_parameters_get_zero_gradients() -> None:
    torch.manual_seed(0)
    model = ActorCritic.for_spaces(
        gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32),
        [8],
    )
    loss = model.value(torch.randn(5, 3)).pow(2).mean()  # the policy head and log_std not reached
    grads, _ = gradients(model, loss, max_grad_norm=10.0)
    assert set(grads) == set(model.state_dict())
    assert torch.equal(grads["log_std"], torch.zeros(1))
    assert torch.equal(grads["policy_head.weight"], torch.zeros_like(model.policy_head.weight))
    assert grads["value_head.bias"].abs().sum() > 0


def test_gradients_are_copies() -> None:
    model = discrete_model()
    b = batch()
    grads, _ = gradients(model, loss_of(model, **b, value_coef=0.5, entropy_coef=0.0).total, 1.0)
    snapshot = {k: v.clone() for k, v in grads.items()}
    model.zero_grad(set_to_none=False)
    for name in grads:
        assert torch.equal(grads[name], snapshot[name])


def test_rollout_loss_is_the_loss_of_the_rollouts_advantages() -> None:
    from a3c_http.algos.a3c.algorithm import rollout_loss
    from a3c_http.envs.rollout import RolloutCollector
    from a3c_http.models.actor_critic import build_model

    cfg = train_config(seed=0, num_envs=2, t_max=30, gae_lambda=0.9, entropy_coef=0.05)
    torch.manual_seed(0)
    model = build_model(cfg.env_id, cfg.env_kwargs, cfg.hidden_sizes)
    collector = RolloutCollector(cfg.env_id, cfg.env_kwargs, cfg.num_envs, seed=0)
    try:
        r = collector.collect(model, cfg.t_max)
    finally:
        collector.close()
    adv, ret = compute_advantages(r.rewards, r.values, r.last_value, r.terminated, r.truncated,
                                  r.valid, cfg.gamma, cfg.gae_lambda)
    expected = loss_of(model, r.obs, actions=r.actions, advantages=adv, returns=ret,
                       valid=r.valid, value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef)
    got = rollout_loss(model, r, cfg)
    assert torch.allclose(got.total, expected.total)
    assert torch.allclose(got.entropy, expected.entropy)


def test_the_plain_rmsprop_step_is_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    """make_optimizer's RMSprop against torch's own, on the master's one flat tensor, with
    learning rates scaled as staleness scaling does: through the fused kernel within float32's
    rounding, and a gradient the kernel cannot read (strided) through torch's operations, bit
    for bit."""
    from a3c_http import tuning
    from a3c_http.optim.optimizers import PlainRMSprop, make_optimizer

    assert tuning.fused_rmsprop()  # probed before the kernel is counted
    fused = []
    kernel = torch._fused_adagrad_
    counted = lambda *args, **kwargs: fused.append(1) or kernel(*args, **kwargs)  # noqa: E731
    monkeypatch.setattr(torch, "_fused_adagrad_", counted)
    config = train_config(seed=0)
    for strided in (False, True):
        torch.manual_seed(1)
        ours = torch.nn.Parameter(torch.randn(1_000))
        theirs = torch.nn.Parameter(ours.detach().clone())
        optimizer = make_optimizer([ours], config)
        reference = torch.optim.RMSprop([theirs], lr=config.lr, alpha=0.99, eps=1e-5)
        assert type(optimizer) is PlainRMSprop
        for scale in (1.0, 0.5, 1.0, 0.25):
            g = torch.randn(2_000)[::2] if strided else torch.randn(1_000)
            ours.grad, theirs.grad = g, g.clone()
            for opt in (optimizer, reference):
                opt.param_groups[0]["lr"] = config.lr * scale
                opt.step()
            mine, torchs = optimizer.state[ours], reference.state[theirs]
            if strided:
                assert torch.equal(ours.detach(), theirs.detach())
                assert torch.equal(mine["square_avg"], torchs["square_avg"])
            else:  # a few units in the last place (1.2e-7 near 1), far below a step (7e-4)
                torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=5e-7)
                square_avg = mine["square_avg"]
                torch.testing.assert_close(square_avg, torchs["square_avg"], rtol=2e-6, atol=0)
        assert mine["step"] == torchs["step"] == 4
        assert len(fused) == 4  # the contiguous case's steps, none of the strided one's


def test_the_fused_kernel_probe_says_no_on_a_torch_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from a3c_http import tuning

    assert tuning.fused_adagrad_problem() is None
    monkeypatch.delattr(torch, "_fused_adagrad_")
    assert tuning.fused_adagrad_problem() == "torch._fused_adagrad_ is gone"


def test_adam_is_torchs_fused_adam_within_rounding() -> None:
    from a3c_http.optim.optimizers import make_optimizer

    config = train_config(seed=0, optimizer="adam")
    torch.manual_seed(1)
    ours = torch.nn.Parameter(torch.randn(1_000))
    theirs = torch.nn.Parameter(ours.detach().clone())
    optimizer = make_optimizer([ours], config)
    reference = torch.optim.Adam([theirs], lr=config.lr)  # torch's default: foreach
    assert optimizer.param_groups[0]["fused"] and not reference.param_groups[0]["fused"]
    for _ in range(3):
        ours.grad, theirs.grad = (g := torch.randn(1_000)), g.clone()
        optimizer.step()
        reference.step()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=5e-7)


def test_tensorflows_rmsprop_starts_its_mean_square_at_ones_and_adds_eps_under_the_root() -> None:
    from a3c_http.optim.optimizers import RMSpropTF

    p = torch.nn.Parameter(torch.zeros(3))
    optimizer = RMSpropTF([p], lr=0.1, alpha=0.99, eps=1e-5)
    g = torch.tensor([2.0, 0.0, -0.5])
    p.grad = g.clone()
    optimizer.step()
    square = 0.99 * torch.ones(3) + 0.01 * g * g
    assert torch.allclose(p.detach(), -0.1 * g / torch.sqrt(square + 1e-5))
    p.grad = g.clone()
    optimizer.step()
    second = 0.99 * square + 0.01 * g * g
    first = -0.1 * g / torch.sqrt(square + 1e-5)
    assert torch.allclose(p.detach(), first - 0.1 * g / torch.sqrt(second + 1e-5))
    assert set(optimizer.state[p]) == {"step", "square_avg"}  # RMSprop's names: saved alike
