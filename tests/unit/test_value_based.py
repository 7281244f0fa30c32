"""The value-based algorithms' parts with tensors alone: the Q-network and its heads, Ape-X's
exploration, n-step transitions across episode ends, the DQN loss, the replay and its sum tree."""

from __future__ import annotations

import math
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from a3c_http.algos.a3c.algorithm import A3C
from a3c_http.algos.apex.algorithm import ApexActor
from a3c_http.algos.dqn.algorithm import epsilon_at
from a3c_http.algos.dqn.loss import Transitions, dqn_loss, nstep_transitions
from a3c_http.algos.exploration import derive
from a3c_http.algos.registry import algorithm_class, model_for, train_config
from a3c_http.algos.replay import MAX_PRIORITY, Replay, SumTree
from a3c_http.models.encoders import UnsupportedSpace
from a3c_http.models.q_network import EpsilonGreedy, QNetwork
from tests.unit.test_learners import _crafted


def test_dueling_q_values_are_the_value_plus_centred_advantages() -> None:
    torch.manual_seed(0)
    net = QNetwork((4,), 3, dueling=True)
    obs = torch.randn(5, 4)
    features = net.torso(obs)
    advantages = net.q_head(features)
    q = net(obs)
    assert q.shape == (5, 3)
    torch.testing.assert_close(q.mean(dim=1), net.value_head(features).squeeze(1))
    centred = advantages - advantages.mean(1, keepdim=True)
    torch.testing.assert_close(q - q.mean(1, keepdim=True), centred)


def test_q_network_reads_minatar_grids_and_refuses_continuous_actions() -> None:
    space = gym.spaces.Box(0, 1, (10, 10, 4), dtype=bool)
    net = QNetwork.for_spaces(space, gym.spaces.Discrete(3), encoder="small_cnn")
    assert net(torch.zeros(2, 10, 10, 4, dtype=torch.bool)).shape == (2, 3)
    with pytest.raises(UnsupportedSpace, match="not Discrete"):
        QNetwork.for_spaces(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (1,)))


def test_apex_actors_epsilons_span_the_papers_range_and_act_epsilon_greedily() -> None:
    config = train_config(algo="apex")
    eps = [derive(config, i, ApexActor).epsilon for i in range(9)]
    # The first two are the paper's ends (0.4 and 0.4^8), the rest between them.
    assert eps[0] == pytest.approx(0.4) and eps[1] == pytest.approx(0.4**8)
    assert all(0.4**8 < e < 0.4 for e in eps[2:]) and len(set(eps)) == 9
    worker = derive(config, 1, ApexActor).config_for(config)
    assert epsilon_at(worker, 0) == epsilon_at(worker, 10**9) == pytest.approx(0.4**8)
    assert derive(train_config(), 1, A3C).epsilon is None  # only Ape-X's actors have their own

    torch.manual_seed(0)
    net = QNetwork((4,), 3)
    obs = torch.randn(2000, 4)
    best = net(obs).argmax(dim=1)
    dist, value, state = EpsilonGreedy(net, 0.3).act(obs)
    assert state == () and torch.equal(value, net(obs).max(dim=1).values)
    assert torch.equal(QNetwork.greedy(dist), best)  # what evaluation and export play
    random_share = (dist.sample() != best).float().mean()
    assert random_share == pytest.approx(0.3 * 2 / 3, abs=0.04)
    assert (QNetwork.greedy(net.act(obs)[0]) == best).all()


def test_a_dqn_workers_epsilon_falls_linearly_over_its_own_steps() -> None:
    config = train_config(algo="dqn", exploration_steps=1000, exploration_final_eps=0.1)
    assert [epsilon_at(config, n) for n in (0, 500, 1000, 5000)] == pytest.approx(
        [1.0, 0.55, 0.1, 0.1]
    )


def _rollout() -> dict[str, torch.Tensor]:
    """One environment of 6 steps: rewards 1..6, a termination at step 1 (step 2 the autoreset),
    a truncation at step 4 (step 5 the autoreset); observations are their step index."""
    steps = 6
    terminated = torch.zeros(steps, 1, dtype=torch.bool)
    truncated = torch.zeros(steps, 1, dtype=torch.bool)
    valid = torch.ones(steps, 1, dtype=torch.bool)
    terminated[1, 0] = True
    valid[2, 0] = False
    truncated[4, 0] = True
    valid[5, 0] = False
    rewards = torch.arange(1.0, 7.0).unsqueeze(1)
    rewards[~valid] = 0.0
    return {
        "obs": torch.arange(6.0).reshape(6, 1, 1),
        "actions": torch.zeros(steps, 1, dtype=torch.long),
        "rewards": rewards,
        "terminated": terminated,
        "truncated": truncated,
        "valid": valid,
        "last_obs": torch.tensor([[6.0]]),
    }


def test_nstep_transitions_stop_at_episode_ends_and_bootstrap_truncations() -> None:
    g = 0.5
    t = nstep_transitions(**_rollout(), n=3, gamma=g)
    # valid steps 0, 1, 3, 4
    assert t.obs.reshape(-1).tolist() == [0.0, 1.0, 3.0, 4.0]
    # 0: r0 + g r1, then terminated: no bootstrap
    # 1: r1, terminated
    # 3: r3 + g r4, truncated at 4: bootstrap from obs 5 (the episode's last) with g^2
    # 4: r4, truncated: bootstrap from obs 5 with g
    torch.testing.assert_close(t.returns, torch.tensor([1 + g * 2, 2.0, 4 + g * 5, 5.0]))
    torch.testing.assert_close(t.discounts, torch.tensor([0.0, 0.0, g**2, g]))
    assert t.next_obs.reshape(-1).tolist() == [2.0, 2.0, 5.0, 5.0]


def test_nstep_transitions_at_the_rollouts_end_bootstrap_from_its_last_observation() -> None:
    steps = 4
    flags = torch.zeros(steps, 1, dtype=torch.bool)
    t = nstep_transitions(
        obs=torch.arange(4.0).reshape(4, 1, 1), actions=torch.zeros(4, 1, dtype=torch.long),
        rewards=torch.ones(steps, 1), terminated=flags, truncated=flags,
        valid=torch.ones(steps, 1, dtype=torch.bool), last_obs=torch.tensor([[9.0]]),
        n=3, gamma=0.9,
    )  # fmt: skip
    torch.testing.assert_close(t.returns, torch.tensor([2.71, 2.71, 1.9, 1.0]))
    torch.testing.assert_close(t.discounts, torch.tensor([0.729, 0.729, 0.81, 0.9]))
    assert t.next_obs.reshape(-1).tolist() == [3.0, 9.0, 9.0, 9.0]


class _Table(torch.nn.Module):
    """Q-values looked up by the observation's integer."""

    def __init__(self, table: list[list[float]]) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.table[obs.reshape(-1).long()]


def test_dqn_loss_double_picks_with_the_online_network_and_weights_samples() -> None:
    online = _Table([[1.0, 0.0], [0.0, 3.0]])
    target = _Table([[0.0, 0.0], [10.0, 20.0]])
    batch = Transitions(
        obs=torch.tensor([0.0]), actions=torch.tensor([0]), returns=torch.tensor([1.0]),
        next_obs=torch.tensor([1.0]), discounts=torch.tensor([0.5]),
    )  # fmt: skip
    # double: a* = argmax online(1) = 1, target 20: y = 1 + 10 = 11; q = 1; TD 10
    loss, td = dqn_loss(online, target, batch, double=True)
    assert td.tolist() == [10.0] and loss.item() == pytest.approx(9.5)  # Huber: |x| - 0.5
    online.table.data[1] = torch.tensor([3.0, 0.0])  # online prefers action 0 at s'
    _, td = dqn_loss(online, target, batch, double=True)
    assert td.tolist() == [5.0]  # y = 1 + 0.5 * 10
    _, td = dqn_loss(online, target, batch, double=False)
    assert td.tolist() == [10.0]  # the target's own best: 20
    loss, _ = dqn_loss(online, target, batch, double=False, weights=torch.tensor([0.25]))
    assert loss.item() == pytest.approx(9.5 * 0.25)
    loss.backward()
    assert target.table.grad is None  # the target network is not trained


def test_sum_tree_finds_prefix_sums_and_keeps_the_total() -> None:
    tree = SumTree(5)
    tree.set(np.arange(5), np.array([1.0, 2.0, 3.0, 4.0, 0.0]))
    assert tree.total == 10.0
    assert tree.find(np.array([0.0, 0.99, 1.0, 2.99, 3.0, 9.99])).tolist() == [0, 0, 1, 1, 2, 3]
    tree.set(np.array([3, 3]), np.array([7.0, 1.0]))  # the last value wins
    assert tree.total == 7.0 and tree.get(np.array([3])).tolist() == [1.0]


def test_replay_is_bounded_overwrites_the_oldest_and_samples_by_priority() -> None:
    replay = Replay(capacity=4, alpha=1.0)
    replay.add({"x": torch.arange(3.0)}, priorities=torch.tensor([1.0, 1.0, 1.0]))
    first_bytes = replay.nbytes
    replay.add({"x": torch.arange(3.0, 6.0)}, priorities=torch.tensor([1.0, 1.0, 96.0]))
    assert len(replay) == 4 and replay.nbytes == first_bytes == 4 * 4
    assert sorted(replay.rows["x"].tolist()) == [2.0, 3.0, 4.0, 5.0]  # 0 and 1 overwritten
    rng = np.random.default_rng(0)
    batch, index, weights = replay.sample(1000, beta=1.0, generator=rng)
    share = (batch["x"] == 5.0).float().mean().item()
    assert share == pytest.approx(96 / 99, abs=0.02)
    # The most likely row weighs least; weights are normalised to a maximum of 1.
    assert weights.max().item() == pytest.approx(1.0)
    assert weights[batch["x"] == 5.0].max() < weights[batch["x"] != 5.0].min()
    replay.update(index[batch["x"] == 5.0][:1], torch.tensor([0.0]))
    batch, _, _ = replay.sample(1000, generator=rng)
    assert (batch["x"] == 5.0).float().mean().item() < 0.01


def test_uniform_replay_samples_every_row_alike_and_new_rows_get_the_highest_priority() -> None:
    replay = Replay(capacity=100, alpha=0.0)
    replay.add({"x": torch.arange(10.0)})
    batch, _, weights = replay.sample(5000, beta=0.4, generator=np.random.default_rng(1))
    counts = torch.bincount(batch["x"].long(), minlength=10).float()
    assert counts.min() > 400 and counts.max() < 600
    assert (weights == 1.0).all()
    with pytest.raises(ValueError, match="empty"):
        Replay(3).sample(1)
    prioritized = Replay(capacity=10, alpha=1.0)
    prioritized.add({"x": torch.zeros(2)}, priorities=torch.tensor([5.0, 1.0]))
    prioritized.add({"x": torch.ones(1)})  # no priority: the highest so far (5)
    assert prioritized.tree.get(np.array([2])).item() == pytest.approx(5.0, rel=1e-5)


def test_a_td_error_no_network_makes_gives_its_row_the_lowest_priority() -> None:
    """Beyond MAX_PRIORITY or not finite (a crafted transition's): the row is sampled least,
    and the tree's total stays finite, where such a priority would make sampling raise."""
    replay = Replay(capacity=8, alpha=0.6)
    replay.add({"x": torch.arange(4.0)}, priorities=torch.ones(4))
    replay.update(np.arange(4), torch.tensor([math.inf, math.nan, 3e38, MAX_PRIORITY]))
    assert replay.tree.get(np.arange(3)).tolist() == [replay.eps**0.6] * 3
    assert replay.max_priority == pytest.approx(MAX_PRIORITY)
    batch, _, weights = replay.sample(64, beta=1.0, generator=np.random.default_rng(0))
    assert (batch["x"] == 3.0).all() and bool(torch.isfinite(weights).all())


def test_settings_a_q_network_does_not_take_are_refused_by_name() -> None:
    for field, value in (("core", "lstm"), ("normalize_obs", True), ("normalize_reward", True)):
        with pytest.raises(ValueError, match=f"{field}={value!r} with algo 'dqn'"):
            train_config(algo="dqn", **{field: value})


def test_the_replay_learner_draws_each_batch_while_the_step_before_it_runs(monkeypatch) -> None:
    """Ape-X's learner is handed its minibatches ahead: step i waits for nothing, the draw of
    step i + 1 happens while it runs (a step here goes on only once that draw is done)."""
    cfg = train_config(algo="apex", num_envs=2, t_max=8, queue_size=1, batch_size=4,
                       learning_starts=1, gradient_steps=3)  # fmt: skip
    learner = algorithm_class(cfg).learner(cfg, model_for(cfg), torch.device("cpu"))
    sample, step = learner.replay.sample, learner.train_step
    drawn, seen = [0], threading.Condition()

    def sampling(*args: Any) -> Any:
        rows = sample(*args)
        with seen:
            drawn[0] += 1
            seen.notify_all()
        return rows

    def stepping(batch: Transitions, weights: torch.Tensor) -> Any:
        i = learner.steps
        if i + 1 < cfg.gradient_steps:
            with seen:
                assert seen.wait_for(lambda: drawn[0] >= i + 2, timeout=10), f"step {i} waited"
        return step(batch, weights)

    monkeypatch.setattr(learner.replay, "sample", sampling)
    monkeypatch.setattr(learner, "train_step", stepping)
    assert learner.learn([_crafted(cfg)], 16) is not None
    assert (learner.steps, drawn[0]) == (3, 3)
