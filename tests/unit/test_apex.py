"""Ape-X's actor and learner with tensors alone: the actors' initial priorities, and a learner that
fills its prioritized replay before it steps, refreshes its target network every target_update
steps and hands each new one over once."""

from __future__ import annotations

import torch

from a3c_http.algos.apex.algorithm import ApexActor, ApexLearner, actor_extras, transitions_of
from a3c_http.algos.dqn.loss import nstep_transitions
from a3c_http.algos.learner import rollout_tensors
from a3c_http.algos.registry import model_for, train_config
from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import RolloutCollector
from a3c_http.models.q_network import EpsilonGreedy
from a3c_http.wire.tensors import Layout


def _config(**fields: object) -> TrainConfig:
    base = {"algo": "apex", "hidden_sizes": [16], "num_envs": 2, "t_max": 8, "seed": 0}
    return train_config(**{**base, **fields})


def _rollouts(config: TrainConfig, model: torch.nn.Module, n: int) -> list:
    collector = RolloutCollector.for_config(config, 0)
    try:
        return [collector.collect(EpsilonGreedy(model, 0.5), config.t_max) for _ in range(n)]
    finally:
        collector.close()


def test_initial_priorities_are_the_actors_absolute_td_errors_on_valid_steps() -> None:
    config = _config(n_step=1, t_max=40)  # long enough for an episode end
    torch.manual_seed(0)
    model = model_for(config)
    rollout = _rollouts(config, model, 1)[0]
    assert (~rollout.valid).any()
    priorities = actor_extras(model, rollout, config)["priorities"]
    assert (priorities[~rollout.valid] == 0).all()
    t, e = torch.nonzero(rollout.valid & ~rollout.terminated & ~rollout.truncated)[0]
    following = rollout.obs[t + 1, e] if t + 1 < config.t_max else rollout.last_obs[e]
    with torch.no_grad():
        q = model(rollout.obs[t, e][None])[0, rollout.actions[t, e]]
        y = rollout.rewards[t, e] + config.gamma * model(following[None]).max()
    torch.testing.assert_close(priorities[t, e], (y - q).abs())


def test_the_learner_takes_the_transitions_the_actor_cut_once() -> None:
    """What the actor cut (its rollout's `returns`, `discounts` and `stops`) gives the learner
    the transitions a cut of its own would."""
    config = _config(n_step=3, t_max=40)
    torch.manual_seed(0)
    model = model_for(config)
    rollout = _rollouts(config, model, 1)[0]
    rollout.extras = actor_extras(model, rollout, config)
    taken = transitions_of(rollout_tensors(rollout, ApexActor.own_tensors))
    r = rollout
    own = nstep_transitions(r.obs, r.actions, r.rewards, r.terminated, r.truncated, r.valid,
                            r.last_obs, config.n_step, config.gamma)  # fmt: skip
    for name in ("obs", "actions", "returns", "next_obs", "discounts"):
        torch.testing.assert_close(getattr(taken, name), getattr(own, name))


def test_the_learner_fills_its_replay_then_steps_and_hands_over_each_new_target_once() -> None:
    config = _config(learning_starts=40, gradient_steps=3, target_update=5, batch_size=8)
    torch.manual_seed(0)
    model = model_for(config)
    learner = ApexLearner(config, model_for(config), torch.device("cpu"))
    pushed = []
    for rollout in _rollouts(config, model, 4):
        rollout.extras = actor_extras(model, rollout, config)
        pushed.append(rollout_tensors(rollout, ApexActor.own_tensors))
    before = learner.weights()
    assert learner.learn(pushed[:1], 16) is None  # fewer than learning_starts transitions
    assert torch.equal(learner.weights(), before) and learner.take_target() is None
    metrics = learner.learn(pushed[1:3], 48)
    assert metrics is not None and metrics["replay/size"] == len(learner.replay) >= 40
    assert metrics["train/n_updates"] == 3 and not torch.equal(learner.weights(), before)
    assert learner.take_target() is None  # 3 steps: not yet 5
    learner.learn(pushed[3:], 64)  # steps 4 to 6: a new target at step 5
    target = learner.take_target()
    assert target is not None and learner.take_target() is None
    assert not torch.equal(target, Layout.of(learner.model).flatten(learner.model.state_dict()))
    fresh = ApexLearner(config, model_for(config), torch.device("cpu"))
    fresh.restore_target(target)
    assert torch.equal(Layout.of(fresh.target).flatten(fresh.target.state_dict()), target)
