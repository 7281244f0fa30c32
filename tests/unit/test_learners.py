"""The learners' maths and their rollouts on the wire, with tensors alone: V-trace, PPO's loss,
the experience body's checks, the algorithms' defaults and presets."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from pydantic import ValidationError

from a3c_http.algos.a3c.algorithm import compute_advantages
from a3c_http.algos.impala.algorithm import ImpalaLearner, vtrace
from a3c_http.algos.learner import Batch, expected_tensors, rollout_tensors
from a3c_http.algos.ppo.algorithm import PPOLearner, clip_range, ppo_loss
from a3c_http.algos.registry import algorithm_class, model_for, train_config
from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import RolloutCollector
from a3c_http.wire.named_tensors import decode_tensors, encode_tensors
from a3c_http.wire.protocol import MAX_ABS_RETURN
from a3c_http.wire.tensors import WireError


def _own(cfg: TrainConfig) -> tuple[str, ...]:
    """The per-step tensors of its own that `cfg`'s algorithm sends."""
    return algorithm_class(cfg).own_tensors


def _episode_ends(steps: int = 6, n: int = 3) -> dict[str, torch.Tensor]:
    """A rollout with a termination, a truncation and the autoreset steps after them."""
    torch.manual_seed(0)
    terminated = torch.zeros(steps, n, dtype=torch.bool)
    truncated = torch.zeros(steps, n, dtype=torch.bool)
    valid = torch.ones(steps, n, dtype=torch.bool)
    terminated[2, 0] = True
    valid[3, 0] = False
    truncated[1, 1] = True
    valid[2, 1] = False
    return {
        "rewards": torch.randn(steps, n),
        "values": torch.randn(steps, n),
        "last_value": torch.randn(n),
        "terminated": terminated,
        "truncated": truncated,
        "valid": valid,
    }


@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_on_policy_vtrace_targets_are_the_lambda_returns(lam: float) -> None:
    """With the behaviour policy the learner's (ratios of 1) and c_bar >= 1, V-trace's targets are
    A3C's returns at gae_lambda = vtrace_lambda (the n-step returns at 1), across terminations
    and truncations."""
    r = _episode_ends()
    _, returns = compute_advantages(
        r["rewards"], r["values"], r["last_value"], r["terminated"], r["truncated"], r["valid"],
        0.9, lam,
    )  # fmt: skip
    vs, advantages = vtrace(
        torch.zeros_like(r["rewards"]), r["rewards"], r["values"], r["last_value"],
        r["terminated"], r["truncated"], r["valid"], 0.9, lam=lam,
    )  # fmt: skip
    torch.testing.assert_close(vs, returns)
    assert bool((advantages[~r["valid"]] == 0).all())


def test_vtrace_without_importance_keeps_the_values_and_truncates_the_ratios() -> None:
    """Actions the learner's policy would never take (log ratio -inf) correct nothing: the
    targets are the values. Ratios above rho_bar count as rho_bar."""
    r = _episode_ends()
    never = torch.full_like(r["rewards"], -math.inf)
    vs, advantages = vtrace(
        never, r["rewards"], r["values"], r["last_value"], r["terminated"], r["truncated"],
        r["valid"], 0.9,
    )  # fmt: skip
    torch.testing.assert_close(vs, r["values"] * r["valid"])
    assert bool((advantages == 0).all())
    big = torch.full_like(r["rewards"], 5.0)
    vs_big, adv_big = vtrace(
        big, r["rewards"], r["values"], r["last_value"], r["terminated"], r["truncated"],
        r["valid"], 0.9, rho_bar=1.0, c_bar=1.0,
    )  # fmt: skip
    vs_one, adv_one = vtrace(
        torch.zeros_like(big), r["rewards"], r["values"], r["last_value"], r["terminated"],
        r["truncated"], r["valid"], 0.9,
    )  # fmt: skip
    torch.testing.assert_close(vs_big, vs_one)
    torch.testing.assert_close(adv_big, adv_one)


def test_ppo_clips_the_ratio_where_it_would_gain_by_moving_further() -> None:
    """A positive advantage and a ratio already above 1 + clip: no gradient, counted in
    clip_fraction; the same ratio with a negative advantage still pulls back."""
    cfg = train_config(algo="ppo", normalize_advantage=False, entropy_coef=0.0, value_coef=0.0)
    old = torch.zeros(2)
    log_prob = torch.full((2,), math.log(1.5), requires_grad=True)
    advantages = torch.tensor([1.0, -1.0])
    zeros = torch.zeros(2)
    loss, metrics = ppo_loss(log_prob, old, advantages, zeros, zeros, zeros, zeros, cfg, 0.2)
    loss.backward()
    assert log_prob.grad[0] == 0
    assert log_prob.grad[1] > 0  # minimising pushes the log-probability of the bad action down
    assert metrics["train/clip_fraction"] == 1.0
    assert metrics["train/approx_kl"] == pytest.approx(0.5 - math.log(1.5), rel=1e-5)


def test_ppo_clips_the_values_only_when_asked() -> None:
    log_prob = torch.zeros(2)
    values = torch.tensor([5.0, 5.0])
    old, returns = torch.zeros(2), torch.full((2,), 5.0)
    plain = train_config(algo="ppo", normalize_advantage=False)
    _, m = ppo_loss(log_prob, log_prob, torch.ones(2), values, old, returns, log_prob, plain, 0.2)
    assert m["train/value_loss"] == 0.0
    clipped = train_config(algo="ppo", normalize_advantage=False, clip_range_vf=1.0)
    _, m = ppo_loss(log_prob, log_prob, torch.ones(2), values, old, returns, log_prob, clipped, 0.2)
    assert m["train/value_loss"] == pytest.approx(16.0)


def test_the_clip_range_falls_linearly_when_asked() -> None:
    cfg = train_config(algo="ppo", preset=None, clip_range=0.2, max_steps=1000)
    assert clip_range(cfg, 500) == pytest.approx(0.2)
    linear = cfg.model_copy(update={"clip_range_schedule": "linear"})
    assert clip_range(linear, 500) == pytest.approx(0.1)
    assert clip_range(linear, 2000) == 0.0


def _rollout(cfg: TrainConfig) -> tuple[dict[str, torch.Tensor], torch.nn.Module]:
    model = model_for(cfg)
    collector = RolloutCollector.for_config(cfg, seed=3)
    try:
        return rollout_tensors(collector.collect(model, cfg.t_max), _own(cfg)), model
    finally:
        collector.close()


@pytest.mark.parametrize(
    "overrides",
    [{}, {"normalize_obs": True, "normalize_reward": True}, {"core": "lstm", "t_max": 4}],
    ids=["plain", "normalized", "lstm"],
)
def test_a_collected_rollout_is_what_the_master_expects(overrides: dict) -> None:
    """A worker's rollout passes the master's checks after a trip over the wire, and a learner
    from the same weights takes it as on-policy: one PPO update moves the weights."""
    small = {"algo": "ppo", "num_envs": 2, "t_max": 8, "n_epochs": 1, "batch_size": 8}
    cfg = train_config(**{**small, **overrides})
    tensors, model = _rollout(cfg)
    body = encode_tensors(tensors, {"a3c": "{}"})
    decoded, metadata = decode_tensors(body, expected_tensors(cfg, model, _own(cfg)))
    assert metadata == {"a3c": "{}"}
    learner = PPOLearner(cfg, copy.deepcopy(model), torch.device("cpu"))
    before = learner.weights()
    metrics = learner.learn([decoded], env_steps=16)
    assert not torch.equal(before, learner.weights())
    # The learner, from the weights that acted, finds the log-probabilities the worker sent
    # (with normalize_obs it first merges the rollout's statistics, which moves its inputs).
    if not cfg.normalize_obs:
        assert metrics["train/behaviour_ratio"] == pytest.approx(1.0, abs=1e-5)
    assert {"train/clip_fraction", "train/approx_kl", "train/explained_variance"} <= set(metrics)
    assert Batch.of([decoded, decoded], torch.device("cpu")).obs.shape[1] == 2 * cfg.num_envs


def test_impala_takes_a_step_on_each_minibatch_of_whole_environments(monkeypatch) -> None:
    """n_epochs passes, each a step on every one of `minibatches` groups of the batch's
    environments, which together are the whole batch; too many minibatches are refused."""
    cfg = train_config(algo="impala", num_envs=3, t_max=4, queue_size=2, n_epochs=2, minibatches=4)
    tensors, model = _rollout(cfg)
    learner = ImpalaLearner(cfg, model, torch.device("cpu"))
    seen: list[torch.Tensor] = []
    step_on = learner._step_on
    monkeypatch.setattr(learner, "_step_on", lambda part: seen.append(part.obs) or step_on(part))
    learner.learn([tensors, tensors], env_steps=24)
    assert [obs.shape[1] for obs in seen] == [2, 2, 1, 1] * 2
    both = Batch.of([tensors, tensors], torch.device("cpu")).obs
    torch.testing.assert_close(torch.cat(seen[:4], dim=1), both)
    with pytest.raises(ValidationError, match="minibatches 7 is more than the 6 environments"):
        train_config(algo="impala", num_envs=3, queue_size=2, minibatches=7)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop("log_probs"), "missing tensors ['log_probs']"),
        (lambda t: t.update(extra=torch.zeros(1)), "unexpected tensors ['extra']"),
        (lambda t: t.update(actions=t["actions"].float()), "'actions' has dtype float32"),
        (lambda t: t.update(rewards=t["rewards"][:-1]), "'rewards' has shape"),
        (lambda t: t["rewards"].__setitem__((0, 0), math.nan), "'rewards' holds NaN"),
        (lambda t: t["actions"].__setitem__((1, 0), -1),
         "'actions' holds -1 at [1, 0], outside the action space Discrete(2) (from 0 to 1)"),
        (lambda t: t["log_probs"].__setitem__((0, 1), 0.5),
         "'log_probs' holds 0.5 at [0, 1], outside a discrete policy's log-probabilities "
         "(at most 0)"),
        # the pole's angle, at most 0.42 rad (1.26 widened by the space's width each way)
        (lambda t: t["obs"].__setitem__((2, 1, 2), 7.0),
         "'obs' holds 7 at [2, 1, 2], outside the observation space (a Box of shape (4,)) "
         "widened by its width (from -1.25664 to 1.25664)"),
        (lambda t: t["last_obs"].__setitem__((1, 0), -15.0),  # the cart's position, 4.8 (14.4)
         "'last_obs' holds -15 at [1, 0], outside the observation space"),
    ],
    ids=["missing", "unexpected", "dtype", "shape", "nan", "action", "log-prob", "obs", "last-obs"],
)
def test_a_rollout_that_does_not_fit_is_named(change, message: str) -> None:
    cfg = train_config(algo="ppo", num_envs=2, t_max=4)
    tensors, model = _rollout(cfg)
    change(tensors)
    with pytest.raises(WireError, match=re.escape(message)):
        decode_tensors(encode_tensors(tensors, None), expected_tensors(cfg, model, _own(cfg)))


def test_an_observation_a_little_outside_its_declared_box_is_taken() -> None:
    """As BipedalWalker-v3's hull angle passes pi: a worker that plays such an environment
    honestly is not refused (the pole's angle at 0.5 rad, its Box 0.42)."""
    cfg = train_config(algo="ppo", num_envs=2, t_max=4)
    tensors, model = _rollout(cfg)
    tensors["obs"][2, 1, 2] = 0.5
    decoded, _ = decode_tensors(
        encode_tensors(tensors, None), expected_tensors(cfg, model, _own(cfg))
    )
    assert float(decoded["obs"][2, 1, 2]) == 0.5


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("priorities", -2.0, "'priorities' holds -2 at [1, 1], outside the priorities "
         "(at least 0)"),
        ("stops", 5, "'stops' holds 5 at [1, 1], outside the bootstrap indices (from 1 to 4)"),
        ("stops", 0, "'stops' holds 0 at [1, 1], outside the bootstrap indices (from 1 to 4)"),
        ("discounts", 1.5, "'discounts' holds 1.5 at [1, 1], outside the discounts (from 0 to 1)"),
    ],
    ids=["priority", "stop-past-the-end", "stop-before", "discount"],
)
def test_an_ape_x_rollouts_own_tensors_out_of_range_are_refused(
    name: str, value: float, message: str
) -> None:
    cfg = train_config(algo="apex", num_envs=2, t_max=4)
    tensors = _crafted(cfg)
    tensors[name][1, 1] = value
    expected = expected_tensors(cfg, model_for(cfg), _own(cfg))
    with pytest.raises(WireError, match=re.escape(message)):
        decode_tensors(encode_tensors(tensors, None), expected)


def _crafted(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """A rollout of `cfg`'s shapes that no environment made: every step valid, a uniform
    policy's log-probabilities (for an algorithm that sends them), rewards of 1."""
    tensors = {
        name: torch.zeros(e.shape, dtype=e.dtypes[0])
        for name, e in expected_tensors(cfg, model_for(cfg), _own(cfg)).items()
    }
    tensors["valid"][:] = True
    if "log_probs" in tensors:
        tensors["log_probs"][:] = math.log(0.5)
    if "stops" in tensors:  # one-step transitions, each bootstrapping from the next observation
        tensors["stops"][:] = torch.arange(1, cfg.t_max + 1).unsqueeze(1)
        tensors["discounts"][:] = cfg.gamma
        tensors["returns"][:] = 1.0
    tensors["rewards"][:] = 1.0
    return tensors


_HUGE = 3e38  # finite in float32 (whose largest is 3.4e38); a sum of two is not


@pytest.mark.parametrize(
    "spoil",
    [
        lambda t: t["rewards"].fill_(MAX_ABS_RETURN),  # the largest a run takes
        lambda t: t["rewards"][::2].fill_(-MAX_ABS_RETURN),
        lambda t: t["obs"][..., 1].fill_(_HUGE),  # the cart's velocity: CartPole does not bound it
        lambda t: "log_probs" in t and t["log_probs"].fill_(-_HUGE),
        lambda t: t["valid"].fill_(False),
        lambda t: "priorities" in t and t["priorities"].fill_(_HUGE),
        lambda t: "returns" in t and t["returns"][::2].fill_(MAX_ABS_RETURN),  # Ape-X's actors' cut
    ],
    ids=["rewards", "rewards-both-ways", "obs", "log-probs", "no-valid-step", "priorities",
         "returns"],  # fmt: skip
)
@pytest.mark.parametrize(
    "algo",
    [
        {"algo": "ppo", "n_epochs": 2, "batch_size": 8},
        {"algo": "ppo", "core": "lstm", "n_epochs": 1, "batch_size": 8},
        {"algo": "impala"},
        {"algo": "apex", "learning_starts": 1, "batch_size": 8, "gradient_steps": 4},
    ],
    ids=["ppo", "ppo-lstm", "impala", "apex"],
)
def test_finite_extremes_that_pass_the_checks_never_make_a_learner_raise(spoil, algo) -> None:
    """What passes `expected_tensors` a learner takes without raising: its weights stay finite
    (a step that would leave one non-finite is undone and counted), so do the replay's
    priorities, a rollout with no valid step changes nothing; and a plain rollout after it
    still moves the weights. (A figure of such an update may be infinite: the master leaves
    it out of /status.)"""
    cfg = train_config(num_envs=2, t_max=8, **algo)
    tensors = _crafted(cfg)
    spoil(tensors)
    expected = expected_tensors(cfg, model_for(cfg), _own(cfg))
    decoded, _ = decode_tensors(encode_tensors(tensors, None), expected)  # admitted
    learner = algorithm_class(cfg).learner(cfg, model_for(cfg), torch.device("cpu"))
    before = learner.weights()
    metrics = learner.learn([decoded, decoded], env_steps=32)
    assert bool(torch.isfinite(learner.weights()).all())
    if metrics is None:  # nothing to learn from: nothing changed
        assert torch.equal(before, learner.weights())
    if cfg.algo == "apex":
        assert learner.replay.tree.total < math.inf
    moved = learner.weights()
    learner.learn([_crafted(cfg)], env_steps=48)
    assert not torch.equal(moved, learner.weights())


def test_ppo_learns_with_sb3s_adam_epsilon_and_the_others_with_torchs() -> None:
    for algo, eps in (("ppo", 1e-5), ("impala", 1e-8), ("apex", 1e-8)):
        cfg = train_config(algo=algo, optimizer="adam", num_envs=2, t_max=4)
        learner = algorithm_class(cfg).learner(cfg, model_for(cfg), torch.device("cpu"))
        assert learner.net.optimizer.param_groups[0]["eps"] == eps, algo


def test_a_body_that_is_not_safetensors_is_refused() -> None:
    cfg = train_config(algo="ppo", num_envs=2, t_max=4)
    expected = expected_tensors(cfg, model_for(cfg), _own(cfg))
    for body in (b"", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}", b"\xff" * 8):
        with pytest.raises(WireError):
            decode_tensors(body, expected)


def test_each_algorithm_starts_from_its_defaults_and_its_own_presets() -> None:
    """PPO takes SB3's PPO defaults and its own preset of the task; a field the body
    gives wins; A3C's presets stay A3C's."""
    ppo = train_config(algo="ppo", env_id="LunarLander-v3")
    assert (ppo.optimizer, ppo.n_epochs, ppo.normalize_obs, ppo.t_max) == ("adam", 10, True, 256)
    assert train_config(algo="ppo", env_id="LunarLander-v3", t_max=128).t_max == 128
    assert train_config(algo="ppo", env_id="ALE/Pong-v5").encoder == "nature_cnn"
    assert train_config(algo="ppo", preset=None).t_max == 256  # SB3's 2048 steps an update
    assert train_config(env_id="LunarLander-v3").optimizer == "rmsprop"
    with pytest.raises(ValidationError, match="sync_mode is gone: `algo` alone"):
        train_config(algo="impala", sync_mode="sync")
    with pytest.raises(ValidationError, match="device"):
        train_config(algo="ppo", device="tpu")
