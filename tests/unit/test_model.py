"""ActorCritic: heads per action space, unsupported spaces, entropies checked by hand."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Independent, Normal

from a3c_http.algos.registry import train_config
from a3c_http.models.actor_critic import ActorCritic, UnsupportedSpace, build_model

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
PENDULUM_OBS = gym.spaces.Box(-8.0, 8.0, shape=(3,), dtype=np.float32)
PENDULUM_ACT = gym.spaces.Box(-2.0, 2.0, shape=(1,), dtype=np.float32)


def test_cartpole_gets_a_categorical_head() -> None:
    torch.manual_seed(0)
    model = ActorCritic.for_spaces(CARTPOLE_OBS, gym.spaces.Discrete(2), [16, 16])
    assert model.discrete and model.obs_dim == 4 and model.action_dim == 2
    assert not hasattr(model, "log_std")
    dist, value = model(torch.randn(5, 4))
    assert isinstance(dist, Categorical)
    assert dist.logits.shape == (5, 2)
    assert value.shape == (5,)
    actions = dist.sample()
    assert actions.shape == (5,)
    assert set(actions.tolist()) <= {0, 1}
    assert dist.log_prob(actions).shape == (5,)
    assert dist.entropy().shape == (5,)


def test_pendulum_gets_a_gaussian_head_with_log_std() -> None:
    torch.manual_seed(0)
    model = ActorCritic.for_spaces(PENDULUM_OBS, PENDULUM_ACT, [16])
    assert not model.discrete and model.action_dim == 1
    names = dict(model.named_parameters())
    assert "log_std" in names and names["log_std"].shape == (1,)
    dist, value = model(torch.randn(6, 3))
    assert isinstance(dist, Independent)
    assert isinstance(dist.base_dist, Normal)
    assert value.shape == (6,)
    actions = dist.sample()
    assert actions.shape == (6, 1)
    assert dist.log_prob(actions).shape == (6,)
    assert dist.entropy().shape == (6,)


def test_gaussian_entropy_matches_closed_form() -> None:
    # log_std starts at 0: sigma = 1, so H = 0.5 * log(2 pi e) per dimension.
    obs_space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    act_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    model = ActorCritic.for_spaces(obs_space, act_space, [8])
    dist, _ = model(torch.zeros(4, 3))
    expected = 2 * 0.5 * math.log(2 * math.pi * math.e)  # two action dimensions: 2.8379...
    assert torch.allclose(dist.entropy(), torch.full((4,), expected), atol=1e-5)
    with torch.no_grad():
        model.log_std.fill_(math.log(2.0))  # sigma = 2 adds log 2 per dimension
    dist, _ = model(torch.zeros(4, 3))
    assert torch.allclose(
        dist.entropy(), torch.full((4,), expected + 2 * math.log(2.0)), atol=1e-5
    )


def test_gaussian_log_std_is_clamped() -> None:
    model = ActorCritic.for_spaces(PENDULUM_OBS, PENDULUM_ACT, [8])
    with torch.no_grad():
        model.log_std.fill_(50.0)
    dist, _ = model(torch.zeros(2, 3))
    assert torch.allclose(dist.base_dist.scale, torch.full((2, 1), math.exp(2.0)))


def test_categorical_entropy_is_minus_sum_p_log_p() -> None:
    torch.manual_seed(1)
    model = ActorCritic.for_spaces(CARTPOLE_OBS, gym.spaces.Discrete(3), [8])
    with torch.no_grad():
        # Make the policy far from uniform so a wrong formula cannot pass by accident.
        model.policy_head.weight.mul_(300.0)
    obs = torch.randn(7, 4)
    dist, _ = model(obs)
    logits = model.policy_head(model.policy_torso(obs)).detach()
    p = torch.softmax(logits, dim=-1)
    by_hand = -(p * torch.log(p)).sum(dim=-1)
    assert torch.allclose(dist.entropy(), by_hand, atol=1e-5)
    assert (by_hand < math.log(3) - 1e-3).any()  # really non-uniform
    # The original design's -sum(pi * logits) differs from the true entropy.
    wrong = -(p * logits).sum(dim=-1)
    assert not torch.allclose(dist.entropy(), wrong, atol=1e-3)


def test_categorical_entropy_known_value() -> None:
    # Probabilities (1/2, 1/4, 1/4): H = 0.5 ln 2 + 2 * 0.25 ln 4 = 1.5 ln 2 = 1.0397...
    dist = Categorical(logits=torch.log(torch.tensor([[0.5, 0.25, 0.25]])))
    assert dist.entropy().item() == pytest.approx(1.5 * math.log(2), abs=1e-6)


def test_value_method_matches_forward() -> None:
    model = ActorCritic.for_spaces(CARTPOLE_OBS, gym.spaces.Discrete(2), [8])
    obs = torch.randn(3, 4)
    _, value = model(obs)
    assert torch.allclose(model.value(obs), value)


@pytest.mark.parametrize(
    ("obs_space", "act_space"),
    [
        (gym.spaces.Discrete(5), gym.spaces.Discrete(2)),
        (CARTPOLE_OBS, gym.spaces.MultiDiscrete([2, 3])),
        (CARTPOLE_OBS, gym.spaces.Box(-1.0, 1.0, shape=(2, 2), dtype=np.float32)),
        (CARTPOLE_OBS, gym.spaces.MultiBinary(3)),
    ],
)
def test_unsupported_space_raises(obs_space: gym.Space, act_space: gym.Space) -> None:
    with pytest.raises(UnsupportedSpace) as info:
        ActorCritic.for_spaces(obs_space, act_space, [8])
    assert isinstance(info.value, ValueError)
    assert "space" in str(info.value)


def test_build_model_sizes_from_the_env() -> None:
    model = build_model("CartPole-v1", {}, [32, 16], shared_torso=True)
    assert model.discrete and model.obs_dim == 4 and model.action_dim == 2
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert shapes == {
        "torso.0.weight": (32, 4),
        "torso.0.bias": (32,),
        "torso.2.weight": (16, 32),
        "torso.2.bias": (16,),
        "policy_head.weight": (2, 16),
        "policy_head.bias": (2,),
        "value_head.weight": (1, 16),
        "value_head.bias": (1,),
    }


def test_separate_torsos_keep_the_value_loss_off_the_policy() -> None:
    model = build_model("CartPole-v1", {}, [8])
    assert {n.split(".")[0] for n in model.state_dict()} == {
        "policy_torso", "value_torso", "policy_head", "value_head"
    }
    _, value = model(torch.randn(5, 4))
    value.sum().backward()
    assert all(p.grad is None for p in model.policy_torso.parameters())
    assert all(p.grad is not None for p in model.value_torso.parameters())


def test_normalising_models_carry_their_statistics_in_the_state_dict() -> None:
    model = build_model("Pendulum-v1", {}, [8], normalize_obs=True, normalize_reward=True,
                        log_std_init=-2.0)
    state = model.state_dict()
    assert tuple(state["obs_rms.mean"].shape) == (3,) and tuple(state["ret_rms.var"].shape) == ()
    assert torch.equal(state["log_std"], torch.tensor([-2.0]))
    assert "obs_rms.mean" not in dict(model.named_parameters())
    obs = torch.randn(4, 3)
    with torch.no_grad():
        model.obs_rms.mean.fill_(5.0)
        model.obs_rms.var.fill_(4.0)
    # forward sees (obs - 5) / 2: the same as an unnormalising copy fed those inputs.
    plain = build_model("Pendulum-v1", {}, [8])
    plain.load_state_dict({k: v for k, v in state.items() if "_rms" not in k})
    _, value = model(obs)
    _, expected = plain((obs - 5.0) / 2.0)
    assert torch.allclose(value, expected, atol=1e-5)


def test_build_model_continuous_env() -> None:
    model = build_model("Pendulum-v1", {}, [8])
    assert not model.discrete and model.obs_dim == 3 and model.action_dim == 1
    assert "log_std" in model.state_dict()


def test_initial_policy_is_near_uniform() -> None:
    # Policy head gain 0.01: the first CartPole policy is close to 50/50.
    torch.manual_seed(0)
    model = build_model("CartPole-v1", {}, [64, 64])
    dist, _ = model(torch.randn(32, 4))
    assert torch.allclose(dist.probs, torch.full((32, 2), 0.5), atol=0.05)


# -- encoders and cores ---------------------------------------------------------------------------


def test_the_cnns_take_frames_as_they_come_and_scale_them_inside() -> None:
    torch.manual_seed(0)
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)  # Atari, stacked 4, channels first
    nature = ActorCritic.for_spaces(frames, gym.spaces.Discrete(6), [], encoder="nature_cnn")
    assert sum(p.numel() for p in nature.parameters()) == 1_687_719  # heads right on 512 units
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    dist, value = nature(obs)
    _, scaled = nature(obs.float() / 255)
    assert dist.logits.shape == (3, 6) and torch.allclose(value, scaled, atol=1e-6)
    grids = gym.spaces.Box(0, 1, (10, 10, 4), bool)  # MinAtar: channels last
    small = ActorCritic.for_spaces(grids, gym.spaces.Discrete(3), [64], encoder="small_cnn")
    assert small.encoder.channels_last
    assert small.encoder.convs[0].weight.shape == (16, 4, 3, 3)  # 4 channels, read from the end
    dist, value = small(torch.rand(5, 10, 10, 4) > 0.5)
    assert dist.logits.shape == (5, 3) and torch.isfinite(value).all()
    # MinAtar stacked 4 ([k, 10, 10, C]): the frames' channels side by side, in frame order.
    stacked = gym.spaces.Box(0, 1, (4, 10, 10, 4), bool)
    deep = ActorCritic.for_spaces(stacked, gym.spaces.Discrete(3), [64], encoder="small_cnn")
    assert deep.encoder.convs[0].weight.shape == (16, 16, 3, 3)
    obs = torch.rand(5, 4, 10, 10, 4) > 0.5
    side_by_side = torch.cat([obs[:, k].permute(0, 3, 1, 2) for k in range(4)], 1).float()
    assert torch.equal(deep.encoder._channels_first(obs), side_by_side)


def test_a_cnn_over_vectors_or_tiny_images_says_what_to_use() -> None:
    with pytest.raises(UnsupportedSpace, match="needs image observations.*use encoder 'mlp'"):
        build_model("CartPole-v1", {}, [8], encoder="small_cnn")
    tiny = gym.spaces.Box(0, 255, (4, 20, 20), np.uint8)
    with pytest.raises(UnsupportedSpace, match="too small for its convolutions"):
        ActorCritic.for_spaces(tiny, gym.spaces.Discrete(2), [8], encoder="nature_cnn")
    with pytest.raises(ValueError, match="scale image observations"):
        train_config(env_id="CartPole-v1", encoder="small_cnn", normalize_obs=True)


def test_the_default_network_keeps_its_parameter_names() -> None:
    """Runs saved before encoders and cores existed still open: the same names and shapes."""
    model = build_model("CartPole-v1", {}, [64, 64])
    assert [name for name, _ in model.named_parameters()] == [
        "policy_torso.0.weight", "policy_torso.0.bias", "policy_torso.2.weight",
        "policy_torso.2.bias", "value_torso.0.weight", "value_torso.0.bias",
        "value_torso.2.weight", "value_torso.2.bias", "policy_head.weight", "policy_head.bias",
        "value_head.weight", "value_head.bias",
    ]
