"""Known-answer tests of the A3C advantages and returns (`compute_advantages`), computed by
hand: n-step bootstrapping, episode ends (terminated, truncated), invalid autoreset steps and
GAE's lambda."""

from __future__ import annotations

import torch

from a3c_http.algos.a3c.algorithm import compute_advantages

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
