"""Known-answer tests of the A3C maths: advantages/returns computed by hand, and the loss."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from a3c_http.a3c import a3c_loss, compute_advantages, gradients
from a3c_http.model import ActorCritic

F = torch.float64



# compute_advantages turns the episode flags into float32, so gamma * lambda is rounded to float32
# (0.45 -> 0.44999998...): agreement to 1e-6 is what float32 rollouts get anyway.
ATOL = 1e-6


def col(*xs: float) -> torch.Tensor:
    """A [T, 1] float64 column."""
    return torch.tensor(xs, dtype=F).unsqueeze(1)


def flags(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.bool).unsqueeze(1)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=ATOL, rtol=0), (actual, expected)


# -- compute_advantages ---------------------------------------------------------------------------


def test_n_step_returns_bootstrap_from_last_value() -> None:
    # gamma = 0.5, lambda = 1, no episode end, two independent sub-environments.
    # env 0: rewards 1, 2, 3; values 0.5, 1.0, 1.5; last_value 4
    #   R2 = 3 + 0.5*4   = 5        A2 = 5    - 1.5 = 3.5
    #   R1 = 2 + 0.5*5   = 4.5      A1 = 4.5  - 1.0 = 3.5
    #   R0 = 1 + 0.5*4.5 = 3.25     A0 = 3.25 - 0.5 = 2.75
    # env 1: rewards 0, 0, 1; values 0, 0, 0; last_value 2
    #   R2 = 1 + 0.5*2 = 2, R1 = 0 + 0.5*2 = 1, R0 = 0 + 0.5*1 = 0.5; A = R (values are 0)
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0]], dtype=F)
    values = torch.tensor([[0.5, 0.0], [1.0, 0.0], [1.5, 0.0]], dtype=F)
    last_value = torch.tensor([4.0, 2.0], dtype=F)
    no = torch.zeros(3, 2, dtype=torch.bool)
    adv, ret = compute_advantages(
        rewards, values, last_value, no, no, ~no, gamma=0.5, gae_lambda=1.0
    )
    assert_close(ret, torch.tensor([[3.25, 0.5], [4.5, 1.0], [5.0, 2.0]], dtype=F))
    assert_close(adv, torch.tensor([[2.75, 0.5], [3.5, 1.0], [3.5, 2.0]], dtype=F))


def test_gamma_zero_gives_one_step_rewards() -> None:
    # gamma = 0: R_t = r_t whatever the values; A_t = r_t - V_t.
    rewards, values = col(1.0, -2.0, 3.0), col(0.25, 0.5, 4.0)
    no = flags(0, 0, 0)
    adv, ret = compute_advantages(
        rewards, values, torch.tensor([100.0], dtype=F), no, no, ~no, 0.0, 1.0
    )
    assert_close(ret, col(1.0, -2.0, 3.0))
    assert_close(adv, col(0.75, -2.5, -1.0))


# Layout shared by the episode-end cases (NEXT_STEP autoreset), T = 4, one sub-environment:
#   t=0  valid step of episode 1
#   t=1  last step of episode 1 (terminated or truncated)
#   t=2  autoreset step: invalid; its observation is episode 1's final one, V = 10
#   t=3  first step of episode 2
# rewards 1, 2, 0, 4; values 1, 1, 10, 2; last_value 6; gamma 0.5; lambda 1.
REWARDS = (1.0, 2.0, 0.0, 4.0)
VALUES = (1.0, 1.0, 10.0, 2.0)
VALID = flags(1, 1, 0, 1)
LAST = torch.tensor([6.0], dtype=F)


def test_terminated_step_cuts_bootstrap_and_chain() -> None:
    # t=3: R3 = 4 + 0.5*6 = 7                       A3 = 7 - 2 = 5
    # t=2: invalid                                  A2 = 0, R2 = 0
    # t=1: terminated, V(next) = 10 is ignored:     R1 = 2           A1 = 2 - 1 = 1
    # t=0: R0 = 1 + 0.5*R1 = 2                      A0 = 2 - 1 = 1
    #      (GAE: delta0 = 1 + 0.5*1 - 1 = 0.5; A0 = 0.5 + 0.5*A1 = 1)
    adv, ret = compute_advantages(
        col(*REWARDS), col(*VALUES), LAST, flags(0, 1, 0, 0), flags(0, 0, 0, 0), VALID, 0.5, 1.0
    )
    assert_close(adv, col(1.0, 1.0, 0.0, 5.0))
    assert_close(ret, col(2.0, 2.0, 0.0, 7.0))


def test_truncated_step_bootstraps_from_final_observation_value() -> None:
    # t=3: R3 = 7, A3 = 5 (as above)
    # t=2: invalid: A2 = 0, R2 = 0
    # t=1: truncated, bootstrap from V(final obs) = values[2] = 10:
    #      R1 = 2 + 0.5*10 = 7                      A1 = 7 - 1 = 6
    #      (episode 2's A3 = 5 does not leak in: it would add 0.5*5)
    # t=0: R0 = 1 + 0.5*7 = 4.5                     A0 = 4.5 - 1 = 3.5
    adv, ret = compute_advantages(
        col(*REWARDS), col(*VALUES), LAST, flags(0, 0, 0, 0), flags(0, 1, 0, 0), VALID, 0.5, 1.0
    )
    assert_close(adv, col(3.5, 6.0, 0.0, 5.0))
    assert_close(ret, col(4.5, 7.0, 0.0, 7.0))


def test_truncation_at_rollout_end_bootstraps_from_last_value() -> None:
    # T = 2, truncated at t=1, last_value = V(final obs) = 3, gamma 0.5.
    #   R1 = 1 + 0.5*3 = 2.5 (A1 = 2.5 - 1 = 1.5); R0 = 1 + 0.5*2.5 = 2.25 (A0 = 2.25)
    adv, ret = compute_advantages(
        col(1.0, 1.0), col(0.0, 1.0), torch.tensor([3.0], dtype=F),
        flags(0, 0), flags(0, 1), flags(1, 1), 0.5, 1.0,
    )
    assert_close(ret, col(2.25, 2.5))
    assert_close(adv, col(2.25, 1.5))


def test_episode_end_cuts_the_chain_even_without_the_mask() -> None:
    # Every step valid, gamma 0.5, lambda 0.5; an episode end at t=0 must stop t=1's advantage
    # from flowing back. rewards 1, 1; values 0, 0; last_value 0.
    #   A1 = delta1 = 1
    #   terminated: A0 = delta0 = 1 + 0.5*0*(cut) - 0 = 1  (with the chain it would be 1.25)
    #   truncated:  A0 = 1 + 0.5*V1 - 0 = 1                (V1 = 0; chain cut as well)
    for term, trunc in ((flags(1, 0), flags(0, 0)), (flags(0, 0), flags(1, 0))):
        adv, _ = compute_advantages(
            col(1.0, 1.0), col(0.0, 0.0), torch.tensor([0.0], dtype=F),
            term, trunc, flags(1, 1), 0.5, 0.5,
        )
        assert_close(adv, col(1.0, 1.0))


def test_invalid_step_is_zero_and_only_bootstraps_a_truncated_step() -> None:
    # Changing the reward and value of the invalid step t=2 (reward 100, value -50):
    base_r = (1.0, 2.0, 100.0, 4.0)
    base_v = (1.0, 1.0, -50.0, 2.0)
    no = flags(0, 0, 0, 0)
    # After a termination nothing changes: A = 1, 1, 0, 5; R = 2, 2, 0, 7.
    adv, ret = compute_advantages(
        col(*base_r), col(*base_v), LAST, flags(0, 1, 0, 0), no, VALID, 0.5, 1.0
    )
    assert_close(adv, col(1.0, 1.0, 0.0, 5.0))
    assert_close(ret, col(2.0, 2.0, 0.0, 7.0))
    # After a truncation only the bootstrap V(final obs) = -50 enters (its reward does not):
    #   R1 = 2 + 0.5*(-50) = -23, A1 = -24; R0 = 1 + 0.5*(-23) = -10.5, A0 = -11.5
    adv, ret = compute_advantages(
        col(*base_r), col(*base_v), LAST, no, flags(0, 1, 0, 0), VALID, 0.5, 1.0
    )
    assert_close(adv, col(-11.5, -24.0, 0.0, 5.0))
    assert_close(ret, col(-10.5, -23.0, 0.0, 7.0))


def test_invalid_first_step_of_a_rollout() -> None:
    # The rollout starts on an autoreset step (the previous rollout ended an episode).
    # rewards 7 (ignored), 1; values 3, 0.5; last_value 2; gamma 0.5
    #   R1 = 1 + 0.5*2 = 2, A1 = 1.5; t=0 invalid: 0, 0
    adv, ret = compute_advantages(
        col(7.0, 1.0), col(3.0, 0.5), torch.tensor([2.0], dtype=F),
        flags(0, 0), flags(0, 0), flags(0, 1), 0.5, 1.0,
    )
    assert_close(adv, col(0.0, 1.5))
    assert_close(ret, col(0.0, 2.0))


def test_gae_lambda_below_one() -> None:
    # gamma 0.9, lambda 0.5 (gamma*lambda = 0.45), no episode end.
    # rewards 1, 0, 2; values 0.5, 1.0, -1.0; last_value 3
    #   delta2 = 2 + 0.9*3    - (-1) = 5.7
    #   delta1 = 0 + 0.9*(-1) - 1.0  = -1.9
    #   delta0 = 1 + 0.9*1.0  - 0.5  = 1.4
    #   A2 = 5.7
    #   A1 = -1.9 + 0.45*5.7   = -1.9 + 2.565   = 0.665
    #   A0 =  1.4 + 0.45*0.665 =  1.4 + 0.29925 = 1.69925
    #   R = A + V: 2.19925, 1.665, 4.7
    no = flags(0, 0, 0)
    adv, ret = compute_advantages(
        col(1.0, 0.0, 2.0), col(0.5, 1.0, -1.0), torch.tensor([3.0], dtype=F),
        no, no, ~no, 0.9, 0.5,
    )
    assert_close(adv, col(1.69925, 0.665, 5.7))
    assert_close(ret, col(2.19925, 1.665, 4.7))


def test_gae_lambda_zero_is_one_step_td() -> None:
    # lambda 0: A_t = delta_t. Same numbers as above: 1.4, -1.9, 5.7.
    no = flags(0, 0, 0)
    adv, _ = compute_advantages(
        col(1.0, 0.0, 2.0), col(0.5, 1.0, -1.0), torch.tensor([3.0], dtype=F),
        no, no, ~no, 0.9, 0.0,
    )
    assert_close(adv, col(1.4, -1.9, 5.7))


# -- a3c_loss -------------------------------------------------------------------------------------


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
    ref = a3c_loss(model, **b, value_coef=0.5, entropy_coef=0.01)
    invalid = ~b["valid"]
    changed = {k: v.clone() for k, v in b.items()}
    changed["obs"][invalid] = 1000.0
    changed["actions"][invalid] = (changed["actions"][invalid] + 1) % 3
    changed["advantages"][invalid] = 55.0
    changed["returns"][invalid] = -77.0
    other = a3c_loss(model, **changed, value_coef=0.5, entropy_coef=0.01)
    for name in ("total", "policy_loss", "value_loss", "entropy"):
        assert torch.allclose(getattr(ref, name), getattr(other, name), atol=1e-6), name
    # ...while changing a valid step does change it.
    changed["returns"][0, 0] += 1.0
    moved = a3c_loss(model, **changed, value_coef=0.5, entropy_coef=0.01)
    assert not torch.allclose(ref.value_loss, moved.value_loss)


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")
def test_loss_terms_match_their_definitions_on_valid_steps() -> None:
    model = discrete_model()
    b = batch()
    terms = a3c_loss(model, **b, value_coef=0.5, entropy_coef=0.01)
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
    low = a3c_loss(model, **b, value_coef=0.5, entropy_coef=0.0)
    high = a3c_loss(model, **b, value_coef=0.5, entropy_coef=0.1)
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
    before = a3c_loss(model, **b, value_coef=0.0, entropy_coef=1.0)
    model.zero_grad()
    before.total.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.05 * p.grad
    after = a3c_loss(model, **b, value_coef=0.0, entropy_coef=1.0)
    assert after.entropy.item() > before.entropy.item()


def test_advantages_are_constants() -> None:
    model = discrete_model()
    b = batch()
    b["advantages"] = b["advantages"].clone().requires_grad_(True)
    terms = a3c_loss(model, **b, value_coef=0.5, entropy_coef=0.0)
    terms.total.backward()
    assert b["advantages"].grad is None


def test_all_invalid_raises() -> None:
    model = discrete_model()
    b = batch()
    b["valid"] = torch.zeros_like(b["valid"])
    with pytest.raises(ValueError, match="no valid step"):
        a3c_loss(model, **b, value_coef=0.5, entropy_coef=0.0)


def test_continuous_loss_runs() -> None:
    torch.manual_seed(0)
    model = ActorCritic.for_spaces(
        gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
        [8],
    )
    t, n = 3, 2
    valid = torch.ones(t, n, dtype=torch.bool)
    valid[1, 1] = False
    terms = a3c_loss(
        model, torch.randn(t, n, 3), torch.randn(t, n, 2), torch.randn(t, n), torch.randn(t, n),
        valid, 0.5, 0.01,
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
    big = 1000.0 * a3c_loss(model, **b, value_coef=0.5, entropy_coef=0.01).total
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
    loss = 1e-3 * a3c_loss(model, **b, value_coef=0.5, entropy_coef=0.0).total
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
    grads, _ = gradients(model, a3c_loss(model, **b, value_coef=0.5, entropy_coef=0.0).total, 1.0)
    snapshot = {k: v.clone() for k, v in grads.items()}
    model.zero_grad(set_to_none=False)
    for name in grads:
        assert torch.equal(grads[name], snapshot[name])


def test_rollout_loss_is_the_loss_of_the_rollouts_advantages() -> None:
    from a3c_http.a3c import rollout_loss
    from a3c_http.config import TrainConfig
    from a3c_http.model import build_model
    from a3c_http.rollout import RolloutCollector

    cfg = TrainConfig(seed=0, num_envs=2, t_max=30, gae_lambda=0.9, entropy_coef=0.05)
    torch.manual_seed(0)
    model = build_model(cfg.env_id, cfg.env_kwargs, cfg.hidden_sizes)
    collector = RolloutCollector(cfg.env_id, cfg.env_kwargs, cfg.num_envs, seed=0)
    try:
        r = collector.collect(model, cfg.t_max)
    finally:
        collector.close()
    adv, ret = compute_advantages(r.rewards, r.values, r.last_value, r.terminated, r.truncated,
                                  r.valid, cfg.gamma, cfg.gae_lambda)
    expected = a3c_loss(model, r.obs, r.actions, adv, ret, r.valid, cfg.value_coef,
                        cfg.entropy_coef)
    got = rollout_loss(model, r, cfg)
    assert torch.allclose(got.total, expected.total)
    assert torch.allclose(got.entropy, expected.entropy)
