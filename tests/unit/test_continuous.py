"""The off-policy algorithms of continuous actions (sac, apex_dpg) with tensors alone: their
policies stay in the action Box, their actors cut and prioritise what they send, their learners
step every part they own, keep it all in their state, and take extreme values without raising."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import pytest
import torch

from a3c_http.algos.apex_dpg.algorithm import ApexDPG
from a3c_http.algos.learner import rollout_tensors
from a3c_http.algos.registry import algorithm_class, model_for, train_config
from a3c_http.algos.sac.network import SquashedGaussian
from a3c_http.envs.rollout import RolloutCollector
from a3c_http.optim.flatnet import non_finite_optimizer_state
from a3c_http.wire.named_tensors import decode_tensors, encode_tensors
from a3c_http.wire.tensors import WireError

SMALL = {"env_id": "Pendulum-v1", "seed": 0, "hidden_sizes": [16], "batch_size": 8,
         "learning_starts": 9, "t_max": 8, "gradient_steps": 4}  # fmt: skip


class Port:
    """What an actor's algorithm pushes through (worker/trainer.py's port, in this process)."""

    def __init__(self) -> None:
        self.pushed: list[Any] = []

    def push_experience(self, rollout: Any) -> None:
        self.pushed.append(rollout)

    def learning(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def rollouts(algo: str, count: int, **fields: Any) -> tuple[Any, list[dict[str, torch.Tensor]]]:
    """The run's config and `count` rollouts as its actor pushes them (its own tensors cut)."""
    config = train_config(algo=algo, **{**SMALL, **fields})
    cls = algorithm_class(config)
    model = model_for(config)
    actor, port = cls(config, model, model), Port()
    collector = RolloutCollector.for_config(config, 0)
    for _ in range(count):
        actor.on_rollout(port, collector.collect(actor.policy, config.t_max, 0, False))
    return config, [rollout_tensors(r, cls.own_tensors) for r in port.pushed]


def learner(config: Any, state: dict[str, Any] | None = None) -> Any:
    return algorithm_class(config).learner(config, model_for(config), torch.device("cpu"), state)


@pytest.mark.parametrize("algo", ["sac", "apex_dpg"])
def test_actions_stay_in_the_box_and_one_outside_is_refused(algo: str) -> None:
    config, (rollout, *_) = rollouts(algo, 1)
    box = model_for(config).box
    assert box.low == (-2.0,) and box.high == (2.0,)
    actions = rollout["actions"]
    assert (actions >= -2.0).all() and (actions <= 2.0).all() and actions.std() > 0
    expected = algorithm_class(config).expected(config, model_for(config))
    decode_tensors(encode_tensors(rollout, None), expected)  # as the master checks it
    rollout["actions"][3, 0, 0] = 2.5
    with pytest.raises(WireError, match=r"'actions' holds 2.5 at \[3, 0, 0\], outside the action"):
        decode_tensors(encode_tensors(rollout, None), expected)


def test_the_squashed_gaussian_draws_inside_the_box_with_its_own_density() -> None:
    mu, log_std = torch.tensor([[0.3], [8.0]]), torch.tensor([[-0.5], [0.0]])
    box = model_for(train_config(algo="sac", **SMALL)).box
    dist = SquashedGaussian(mu, log_std, box)
    assert torch.allclose(dist.mean, 2.0 * torch.tanh(mu))
    unit, log_pi = dist.rsample()
    # log_prob of an action of the Box is rsample's density of the same draw
    assert torch.allclose(dist.log_prob(box.from_unit(unit))[:1], log_pi[:1], atol=1e-3)
    drawn = dist.sample()
    assert (drawn.abs() <= 2.0).all() and torch.isfinite(dist.log_prob(drawn)).all()


def test_each_dpg_actor_explores_its_own_amount() -> None:
    config = train_config(algo="apex_dpg", **SMALL)
    noises = [ApexDPG.epsilon_of(config, share) for share in (0.0, 0.5, 1.0)]
    assert noises[0] == pytest.approx(config.dpg_noise) and noises[0] > noises[1] > noises[2]
    own = config.model_copy(update=ApexDPG.own_epsilon(noises[2]))
    model = model_for(own)
    assert ApexDPG(own, model, model).policy.noise == pytest.approx(noises[2])


def test_a_dpg_actor_sends_its_cut_and_priorities() -> None:
    config, (rollout, *_) = rollouts("apex_dpg", 1, n_step=3)
    assert set(ApexDPG.own_tensors) <= set(rollout)
    priorities = rollout["priorities"]
    assert (priorities[rollout["valid"]] > 0).all() and torch.isfinite(priorities).all()
    assert (rollout["stops"] <= config.t_max).all() and (rollout["discounts"] <= 1).all()


@pytest.mark.parametrize(
    ("algo", "fields", "parts"),
    [
        ("sac", {}, {"actor", "critic", "alpha"}),
        ("apex_dpg", {}, {"actor", "critic"}),
        ("apex_dpg", {"twin_critics": True, "policy_delay": 2, "target_noise": 0.2},
         {"actor", "critic"}),
    ],
)  # fmt: skip
def test_a_learner_steps_every_part_and_starts_again_from_its_state(
    algo: str, fields: dict[str, Any], parts: set[str]
) -> None:
    config, pushed = rollouts(algo, 3, **fields)
    first = learner(config)
    before = first.net.flat.clone()
    assert first.learn(pushed[:1], 0) is None  # the replay fills first
    metrics = first.learn(pushed[1:], 16)
    assert metrics is not None and {"train/critic_loss", "train/actor_loss"} <= set(metrics)
    assert (algo == "sac") == ("train/ent_coef" in metrics)
    assert first.steps == config.gradient_steps
    critics = 2 if algo == "sac" or fields.get("twin_critics") else 1
    assert first.model.critic.layers[0].weight.shape[0] == critics
    moved = first.net.flat - before
    for name, region in first.regions.items():
        assert moved[region].abs().sum() > 0, f"the {name} did not move"
    state = first.optimizer_state()
    assert set(state["optimizers"]) == parts
    assert not torch.equal(state["target"], before)  # the targets moved towards the network
    if algo == "sac":
        assert state["log_alpha"] != 0.0  # learned from log(1)

    second = learner(config, state)
    assert torch.equal(second.target_flat, first.target_flat)
    for name in parts:
        ours = second.optimizers[name].state_dict()["state"]
        assert ours and all(
            torch.equal(ours[0][key], value)
            for key, value in first.optimizers[name].state_dict()["state"][0].items()
        )
    if algo == "sac":
        assert second.log_alpha.item() == first.log_alpha.item()
    # What the master checks before it saves the state, and again when it resumes from it,
    # looks through the state's nested optimizers: a NaN in one is found and named.
    assert non_finite_optimizer_state(state) is None
    part = sorted(parts)[-1]
    state["optimizers"][part]["state"][0]["exp_avg_sq"].view(-1)[0] = float("nan")
    assert non_finite_optimizer_state(state) == "'exp_avg_sq' of the optimizer state"


@pytest.mark.parametrize("algo", ["sac", "apex_dpg"])
@pytest.mark.parametrize("extreme", ["rewards", "obs", "returns"])
def test_extreme_values_never_make_a_learner_raise(algo: str, extreme: str) -> None:
    """Finite values as large as float32 holds (which a crafted push may carry, and the master's
    bounds let through where the space is unbounded): the steps they spoil are skipped and
    counted, the weights stay finite, the replay's priorities stay sampleable."""
    config, pushed = rollouts(algo, 3)
    for rollout in pushed[1:]:
        rollout[extreme] = torch.full_like(rollout[extreme], 3e38)
    ours = learner(config)
    for rollout in pushed:
        ours.learn([rollout], 0)
    assert torch.isfinite(ours.net.flat).all() and torch.isfinite(ours.target_flat).all()
    # The learner learns from the actors' returns, not their rewards: those spoil nothing.
    assert (ours.nonfinite_steps > 0) == (extreme != "rewards")
    ours.learn(pushed[:1], 0)  # sampling still works
    assert math.isfinite(ours.replay.tree.total)
