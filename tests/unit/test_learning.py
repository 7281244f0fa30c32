"""The learner end to end in one process, and the running statistics the workers share.

Learning tests stay short: a tiny environment a correct learner solves in a few hundred steps.
The long runs (CartPole-v1, Acrobot-v1, Pendulum-v1, LunarLander-v3, MinAtar's Breakout, the
memory task against SB3-contrib's RecurrentPPO) live in `scripts/bench.py learn`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from a3c_http.algos.a3c.single_process import train
from a3c_http.algos.registry import model_for, train_config
from a3c_http.envs.rollout import RolloutCollector
from a3c_http.models.normalize import RunningMeanStd, moments
from a3c_http.policy import evaluation
from a3c_http.policy.evaluation import evaluate
from a3c_http.wire import tensors as wire


class Signal(gym.Env):
    """Each step shows one of two signals; the action that names it earns 1, the other 0. Ten
    steps an episode: a learner that reads its observation earns 10, a random one 5."""

    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._show(), {}

    def _show(self) -> np.ndarray:
        self._signal = int(self.np_random.integers(2))
        return np.array([1.0, -1.0] if self._signal else [-1.0, 1.0], dtype=np.float32)

    def step(self, action):
        reward = float(int(action) == self._signal)
        self._t += 1
        return self._show(), reward, self._t >= 10, False, {}


gym.register("A3CTestSignal-v0", entry_point=Signal)


@pytest.mark.parametrize("normalize", [False, True])
def test_the_learner_solves_a_tiny_task_in_a_few_hundred_episodes(normalize: bool) -> None:
    config = train_config(
        env_id="A3CTestSignal-v0", num_envs=4, t_max=5, seed=0, target_return=9.5,
        normalize_obs=normalize, normalize_reward=normalize,
    )
    result = train(config, max_steps=20_000)
    assert result.solved, result.mean_return_100
    assert result.env_steps < 10_000


def test_only_a_recurrent_policy_remembers_the_cue(monkeypatch: pytest.MonkeyPatch) -> None:
    """a3c_http/CueMemory-v0: the question at an episode's end asks for the cue of its first
    step. The LSTM carries it (mean return about 1); a feed-forward policy sees the same question
    either way and stays near 0, however long it trains."""
    base = {"env_id": "a3c_http/CueMemory-v0", "t_max": 16, "hidden_sizes": [32], "seed": 0}
    config = train_config(**base, core="lstm", lstm_size=32)
    lstm = train(config, max_steps=100_000)
    assert lstm.solved, lstm.mean_return_100
    # Evaluation carries the state too, from a fresh one each episode, in slots it reuses.
    monkeypatch.setattr(evaluation, "MAX_PARALLEL_ENVS", 3)
    weights = wire.encode(lstm.model.state_dict())
    assert evaluate(config, weights, episodes=12).mean_return >= 0.8
    feed_forward = train(train_config(**base, core="none"), max_steps=20_000)
    assert not feed_forward.solved
    assert feed_forward.mean_return_100 is not None and feed_forward.mean_return_100 < 0.5


def test_merging_batches_gives_the_moments_of_all_samples() -> None:
    torch.manual_seed(0)
    parts = [torch.randn(n, 3) * 4 + 2 for n in (5, 1, 40)]
    rms = RunningMeanStd((3,))
    for part in parts:
        rms.merge(*moments(part))
    everything = torch.cat(parts)
    # The prior count of 1e-4 (at mean 0, var 1) is the only difference.
    assert torch.allclose(rms.mean, everything.mean(0), atol=1e-4)
    assert torch.allclose(rms.var, everything.var(0, unbiased=False), atol=1e-3)
    assert float(rms.count) == pytest.approx(46, abs=1e-3)
    before = rms.state_dict()
    rms.merge(*moments(torch.zeros(0, 3)))  # nothing new: nothing changes
    assert all(torch.equal(before[k], v) for k, v in rms.state_dict().items())


def test_a_rollout_measures_its_observations_and_scales_its_rewards() -> None:
    config = train_config(num_envs=3, seed=0, normalize_obs=True, normalize_reward=True)
    model = model_for(config)
    with torch.no_grad():
        model.ret_rms.var.fill_(4.0)  # rewards of CartPole (1 a step) are scaled to 0.5
    collector = RolloutCollector(config.env_id, {}, 3, seed=0, gamma=0.5)
    try:
        rollout = collector.collect(model, 20)
    finally:
        collector.close()
    valid = rollout.valid
    assert torch.allclose(rollout.rewards[valid], torch.full((int(valid.sum()),), 0.5), atol=1e-4)
    assert float(rollout.statistics["obs_rms.count"]) == rollout.num_steps
    expected_mean = rollout.obs[valid].mean(0)
    assert torch.allclose(rollout.statistics["obs_rms.mean"], expected_mean, atol=1e-5)
    # Discounted returns with gamma 0.5 and reward 1 lie in [1, 2).
    assert 1.0 <= float(rollout.statistics["ret_rms.mean"]) < 2.0
    assert float(rollout.statistics["ret_rms.count"]) == rollout.num_steps


def test_the_learner_reports_its_env_steps_after_every_update() -> None:
    config = train_config(env_id="A3CTestSignal-v0", num_envs=4, t_max=5, seed=0, target_return=1e9)
    seen: list[int] = []
    result = train(config, max_steps=200, progress=seen.append)
    # One call per update, with the steps so far (the reset-only steps left out: at most 20).
    assert len(seen) == result.updates >= 10
    assert all(0 < b - a <= 20 for a, b in zip([0, *seen], seen, strict=False))
    assert seen[-1] == result.env_steps >= 200


@pytest.mark.parametrize(("workers", "lag"), [(3, 1), (3, 2), (1, 2)])
def test_workers_played_in_turn_take_steps_lag_times_workers_minus_one_versions_old(
    workers: int, lag: int
) -> None:
    """The emulation of a cluster's staleness (a3c_http/algos/a3c/single_process.py): once every
    worker has loaded a reply, each update is exactly lag x workers - 1 versions old; before, the
    workers act on the first weights, version 0."""
    config = train_config(env_id="A3CTestSignal-v0", num_envs=4, t_max=5, seed=0, target_return=1e9)
    result = train(config, max_steps=600, workers=workers, lag=lag)
    first = lag * workers
    assert result.updates > first
    assert result.staleness_total == sum(range(first)) + (result.updates - first) * (first - 1)


def test_a_worker_a_reply_behind_acts_on_older_weights_than_a2c_and_repeatably() -> None:
    config = train_config(env_id="A3CTestSignal-v0", num_envs=4, t_max=5, seed=0, target_return=1e9)
    a2c = train(config, max_steps=600)
    behind = [train(config, max_steps=600, lag=2).returns for _ in range(2)]
    assert a2c.staleness_total == 0
    assert behind[0] == behind[1]  # the same run twice: the workers' turns are fixed
    assert behind[0] != a2c.returns  # its actions came from other weights
