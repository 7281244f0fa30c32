"""RolloutCollector on real gymnasium environments: shapes, the autoreset mask, episode stats,
frames in their own dtype, the loss's clipped rewards and lives, the recurrent state."""

from __future__ import annotations

import math
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch

from a3c_http.envs.make import MissingDependency
from a3c_http.envs.rollout import Rollout, RolloutCollector
from a3c_http.envs.tasks import CUE_MEMORY
from a3c_http.models.actor_critic import build_model
from tests.support.common import without_box2d

# CartPole-v1 terminates when |x| > 2.4 or |theta| > 12 degrees.
X_LIMIT = 2.4
THETA_LIMIT = 12 * 2 * math.pi / 360



@pytest.fixture
def cartpole() -> Iterator[RolloutCollector]:
    collector = RolloutCollector("CartPole-v1", {}, num_envs=3, seed=123)
    yield collector
    collector.close()


def collect_many(collector: RolloutCollector, model, t_max: int, times: int) -> list[Rollout]:
    return [collector.collect(model, t_max) for _ in range(times)]


def cat(rollouts: list[Rollout], name: str) -> torch.Tensor:
    return torch.cat([getattr(r, name) for r in rollouts])


def test_cartpole_rollout_shapes(cartpole: RolloutCollector) -> None:
    torch.manual_seed(0)
    model = build_model("CartPole-v1", {}, [16])
    r = cartpole.collect(model, t_max=7, policy_version=12)
    assert r.obs.shape == (7, 3, 4) and r.obs.dtype == torch.float32
    assert r.actions.shape == (7, 3)
    assert r.policy_version == 12
    for name in ("rewards", "values", "log_probs", "terminated", "truncated", "valid"):
        assert getattr(r, name).shape == (7, 3), name
    for name in ("terminated", "truncated", "valid"):
        assert getattr(r, name).dtype == torch.bool, name
    assert r.last_value.shape == (3,)
    # The first step after reset is a real transition for every sub-environment.
    assert r.valid[0].all()
    # values are V(obs), log_probs log pi(a|obs), under the model that acted.
    with torch.no_grad():
        dist, v = model(r.obs.reshape(-1, 4))
    assert torch.allclose(r.values.reshape(-1), v, atol=1e-6)
    assert torch.allclose(r.log_probs.reshape(-1), dist.log_prob(r.actions.reshape(-1)), atol=1e-6)


def test_cartpole_mask_rewards_and_episode_lengths(cartpole: RolloutCollector) -> None:
    torch.manual_seed(0)
    model = build_model("CartPole-v1", {}, [16])
    rollouts = collect_many(cartpole, model, t_max=200, times=3)
    valid, term = cat(rollouts, "valid"), cat(rollouts, "terminated")
    trunc = cat(rollouts, "truncated")
    rewards, obs = cat(rollouts, "rewards"), cat(rollouts, "obs")
    episodes = [ep for r in rollouts for ep in r.episodes]
    ended = term | trunc
    steps, n = valid.shape
    assert steps == 600 and n == 3

    # Enough episodes ended in every sub-environment for the checks below to mean something.
    assert (ended.sum(dim=0) >= 3).all(), ended.sum(dim=0)
    assert not trunc.any()  # a random policy never lasts 500 steps

    # valid is False exactly on the step after an episode end, also across rollout boundaries.
    assert valid[0].all()
    assert torch.equal(valid[1:], ~ended[:-1])
    # Nothing happens on an autoreset step: no reward, no episode end.
    assert (rewards[~valid] == 0).all()
    assert not ended[~valid].any()
    # CartPole pays 1 per real step.
    assert (rewards[valid] == 1).all()
    assert sum(r.num_steps for r in rollouts) == int(valid.sum())

    # NEXT_STEP autoreset: the autoreset step observes the episode's final (failed) state.
    for t, i in torch.nonzero(term[:-1]).tolist():
        x, theta = obs[t + 1, i, 0].item(), obs[t + 1, i, 2].item()
        assert abs(x) > X_LIMIT or abs(theta) > THETA_LIMIT, (t, i, x, theta)

    # Episode lengths equal the count of valid steps of each episode, in order of their end.
    expected: list[int] = []
    counts = [0] * n
    for t in range(steps):
        for i in range(n):
            counts[i] += int(valid[t, i])
            if ended[t, i]:
                expected.append(counts[i])
                counts[i] = 0
    assert [ep.length for ep in episodes] == expected
    assert [ep.reward for ep in episodes] == [float(x) for x in expected]
    assert all(ep.length >= 8 for ep in episodes)  # CartPole cannot fail faster


def test_rollout_episode_stats_continue_across_rollouts(cartpole: RolloutCollector) -> None:
    torch.manual_seed(1)
    model = build_model("CartPole-v1", {}, [16])
    short = collect_many(cartpole, model, t_max=3, times=40)
    lengths = [ep.length for r in short for ep in r.episodes]
    assert lengths, "no episode ended in 120 steps"
    # Episodes are much longer than one 3-step rollout: their lengths add up over rollouts.
    assert max(lengths) > 3
    assert sum(lengths) <= sum(r.num_steps for r in short)


def test_truncation_via_max_episode_steps() -> None:
    collector = RolloutCollector("CartPole-v1", {"max_episode_steps": 5}, num_envs=2, seed=0)
    try:
        torch.manual_seed(0)
        model = build_model("CartPole-v1", {"max_episode_steps": 5}, [16])
        rollouts = collect_many(collector, model, t_max=10, times=3)
    finally:
        collector.close()
    valid, term = cat(rollouts, "valid"), cat(rollouts, "terminated")
    trunc = cat(rollouts, "truncated")
    episodes = [ep for r in rollouts for ep in r.episodes]
    # Five real steps, a truncation, one autoreset step: period 6.
    expected_trunc = torch.zeros(30, 2, dtype=torch.bool)
    expected_trunc[4::6] = True
    expected_valid = torch.ones(30, 2, dtype=torch.bool)
    expected_valid[5::6] = False
    assert not term.any()
    assert torch.equal(trunc, expected_trunc)
    assert torch.equal(valid, expected_valid)
    assert len(episodes) == 2 * 5
    assert all(ep.length == 5 and ep.reward == 5.0 for ep in episodes)


def test_pendulum_box_actions_are_clipped_for_the_env() -> None:
    collector = RolloutCollector("Pendulum-v1", {}, num_envs=2, seed=0)
    sent: list[np.ndarray] = []
    step = collector.envs.step

    def recording_step(actions: np.ndarray):
        sent.append(np.array(actions, copy=True))
        return step(actions)

    collector.envs.step = recording_step  # type: ignore[method-assign]
    try:
        torch.manual_seed(0)
        model = build_model("Pendulum-v1", {}, [16])
        with torch.no_grad():
            model.log_std.fill_(2.0)  # sigma = e^2 = 7.4: most samples fall outside [-2, 2]
        r = collector.collect(model, t_max=20)
    finally:
        collector.close()
    assert r.obs.shape == (20, 2, 3)
    assert r.actions.shape == (20, 2, 1)
    assert r.rewards.shape == (20, 2)
    # The behaviour log-probabilities are the Gaussian's, of the actions as sampled.
    with torch.no_grad():
        dist, _ = model(r.obs.reshape(-1, 3))
    expected = dist.log_prob(r.actions.reshape(-1, 1)).reshape(20, 2)
    assert torch.allclose(r.log_probs, expected, atol=1e-5)
    assert r.valid.all()  # Pendulum episodes last 200 steps
    assert (r.rewards <= 0).all()
    # The rollout keeps the sampled actions (their log-probabilities are what the loss needs)...
    assert r.actions.abs().max().item() > 2.0
    # ...while the environment only ever saw actions inside its bounds.
    assert len(sent) == 20
    stacked = np.stack(sent)
    assert stacked.shape == (20, 2, 1)
    assert stacked.min() >= -2.0 and stacked.max() <= 2.0
    assert np.allclose(stacked, np.clip(r.actions.numpy(), -2.0, 2.0))


def test_same_seed_same_rollout() -> None:
    results = []
    for _ in range(2):
        collector = RolloutCollector("CartPole-v1", {}, num_envs=2, seed=42)
        torch.manual_seed(5)
        model = build_model("CartPole-v1", {}, [16])
        results.append(collector.collect(model, t_max=30))
        collector.close()
    a, b = results
    assert torch.equal(a.obs, b.obs)
    assert torch.equal(a.actions, b.actions)
    assert torch.equal(a.valid, b.valid)


def test_a_workers_environments_say_how_to_install_a_missing_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a worker without Box2D reports (the master's POST /train says the same: see
    test_http_bad_input.py), rather than gymnasium's own pip hint."""
    without_box2d(monkeypatch)
    with pytest.raises(MissingDependency, match=r"\./scripts/setup_venv\.sh box2d"):
        RolloutCollector("LunarLander-v3", {}, num_envs=2, seed=1)


# -- frames, clipped rewards, lives and recurrent state ------------------------------------------


class Frames(gym.Env):
    """uint8 frames, a reward of 5 a step, 2 lives: the second step loses one, the fourth ends
    the episode (return 20, length 4)."""

    observation_space = gym.spaces.Box(0, 255, shape=(2, 6, 6), dtype=np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._frame(), {"lives": 2}

    def _frame(self) -> np.ndarray:
        return np.full((2, 6, 6), 40 * self._t + 7, dtype=np.uint8)

    def step(self, action):
        self._t += 1
        return self._frame(), 5.0, self._t >= 4, False, {"lives": 2 if self._t < 2 else 1}


gym.register("A3CTestFrames-v0", entry_point=Frames)


def test_frames_stay_uint8_the_loss_sees_clipped_rewards_and_lives_and_episodes_are_true() -> None:
    collector = RolloutCollector(
        "A3CTestFrames-v0", {}, num_envs=2, seed=0, clip_reward=True, life_loss=True
    )
    try:
        model = build_model("A3CTestFrames-v0", {}, [8], encoder="small_cnn")
        r = collector.collect(model, t_max=10)
    finally:
        collector.close()
    assert r.obs.dtype == torch.uint8 and int(r.obs[0, 0, 0, 0, 0]) == 7
    valid = r.valid[:, 0]
    assert valid.tolist() == [True, True, True, True, False] * 2
    assert r.rewards[:, 0][valid].unique().tolist() == [1.0]  # 5, clipped for the loss
    # The life lost at the second step ends the bootstrap there, and the episode goes on.
    assert r.terminated[:, 0].tolist() == [False, True, False, True, False] * 2
    assert [(e.reward, e.length) for e in r.episodes] == [(20.0, 4)] * 4
    assert r.starts[:, 0].tolist() == [True, False, False, False, False] * 2


@pytest.mark.parametrize("lstm_first", [False, True])
def test_a_recurrent_rollout_carries_its_state_and_the_loss_unrolls_what_acted(
    lstm_first: bool,
) -> None:
    """CueMemory's episodes are 6 steps: rollouts of 4 cut them, so the state crosses rollouts,
    and every episode start zeroes it. The loss's unroll from the rollout's first state gives
    the very values the rollout acted with, in either layout (torso before or after the LSTM)."""
    torch.manual_seed(0)
    collector = RolloutCollector(CUE_MEMORY, {}, num_envs=3, seed=0)
    try:
        model = build_model(CUE_MEMORY, {}, [8], core="lstm", lstm_size=8, lstm_first=lstm_first)
        rollouts = collect_many(collector, model, t_max=4, times=3)
    finally:
        collector.close()
    parts = 4 if lstm_first else 2  # the policy's (h, c), then the value's LSTM's
    assert all(len(r.state) == parts and r.state[0].shape == (3, 8) for r in rollouts)
    assert not any(r.state[0].abs().sum() == 0 for r in rollouts[1:])  # carried, not zeroed
    starts = cat(rollouts, "starts")
    valid = cat(rollouts, "valid")
    assert starts[0].all() and (starts[1:] == ~valid[:-1]).all()
    with torch.no_grad():
        for r in rollouts:
            _, values = model.unroll(r.obs, r.state, r.starts)
            assert torch.allclose(values, r.values, atol=1e-6)
        # Without the reset where the second episode starts, the unroll is not what acted.
        r = rollouts[1]
        assert r.starts.any()
        _, unreset = model.unroll(r.obs, r.state, torch.zeros_like(r.starts))
        assert not torch.allclose(unreset, r.values, atol=1e-6)


def test_cartpole_without_velocities_is_cartpole_seen_through_its_positions() -> None:
    """a3c_http/CartPoleNoVel-v1 plays CartPole-v1's very episodes, seeded alike, and shows
    only the cart's position and the pole's angle of each observation."""
    from a3c_http.envs.make import register_family
    from a3c_http.envs.tasks import CARTPOLE_NO_VELOCITY

    register_family(CARTPOLE_NO_VELOCITY)
    full, masked = gym.make("CartPole-v1"), gym.make(CARTPOLE_NO_VELOCITY)
    assert masked.observation_space.shape == (2,) and masked.spec.max_episode_steps == 500
    seen, _ = full.reset(seed=4)
    shown, _ = masked.reset(seed=4)
    for _ in range(600):
        assert np.array_equal(shown, seen[[0, 2]]) and masked.observation_space.contains(shown)
        action = int(seen[2] > 0)  # push towards where the pole leans: it falls in time
        seen, reward, *ended = full.step(action)
        shown, masked_reward, *masked_ended = masked.step(action)
        assert (masked_reward, masked_ended[:2]) == (reward, ended[:2])
        if any(ended[:2]):
            break
    assert any(ended[:2])
