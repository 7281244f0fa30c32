"""TrainConfig validation and resolution (the settings from the environment: test_settings.py)."""

from __future__ import annotations

import math
import re

import gymnasium as gym
import pytest
import torch
from pydantic import ValidationError

from a3c_http.algos.registry import config_json, train_config
from a3c_http.config.training import MAX_SEED, TrainConfig

# -- TrainConfig ----------------------------------------------------------------------------------


def test_defaults_are_valid_and_match_the_contract() -> None:
    cfg = train_config()
    assert cfg.env_id == "CartPole-v1"
    assert cfg.algo == "a3c" and type(cfg).__name__ == "A3CConfig"
    assert cfg.num_envs >= 1
    assert cfg.hidden_sizes and all(w >= 1 for w in cfg.hidden_sizes)
    assert 0 < cfg.lr <= 1
    assert 0 <= cfg.gamma <= 1
    assert cfg.heartbeat_timeout_s > cfg.heartbeat_interval_s
    assert cfg.target_return is None and cfg.seed is None
    # Every update takes the full learning rate unless asked (README, "Staleness").
    assert cfg.staleness_scaling == "none"
    # The defaults survive a JSON round trip, as they do through POST /train.
    assert config_json(cfg.model_dump_json()) == cfg


def test_config_is_frozen() -> None:
    cfg = train_config()
    with pytest.raises(ValidationError):
        cfg.lr = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "meant"),
    [
        # The names of Stable-Baselines3, the RL Zoo and CleanRL.
        ("learning_rate", "did you mean 'lr'?"),
        ("n_steps", "did you mean 't_max'?"),
        ("ent_coef", "did you mean 'entropy_coef'?"),
        ("vf_coef", "did you mean 'value_coef'?"),
        ("n_envs", "did you mean 'num_envs'?"),
        ("normalize", "did you mean 'normalize_obs' or 'normalize_reward'?"),
        # Misspellings of our own.
        ("gama", "did you mean 'gamma'?"),
        ("hidden_size", "did you mean 'hidden_sizes'?"),
        (
            "bogus_field",
            "the fields are those of docs/configuration.md's \"Training config\" table",
        ),
    ],
)
def test_unknown_field_is_refused_and_named_with_what_was_meant(field: str, meant: str) -> None:
    with pytest.raises(ValidationError) as info:
        train_config(**{field: 0.1}, num_envs=0)
    errors = {e["loc"]: e for e in info.value.errors()}
    assert set(errors) == {(field,), ("num_envs",)}  # the other errors are still there
    assert errors[(field,)]["type"] == "extra_forbidden"
    assert errors[(field,)]["msg"].startswith(f"unknown field {field!r}: {meant}")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lr", 0.0),
        ("lr", -1e-3),
        ("lr", math.nan),
        ("lr", math.inf),
        ("gamma", 1.01),
        ("gamma", -0.1),
        ("gae_lambda", 1.5),
        ("num_envs", 0),
        ("t_max", 0),
        ("hidden_sizes", [64, 0]),
        ("hidden_sizes", [64] * 9),
        ("hidden_sizes", [5000]),
        ("entropy_coef", math.inf),
        ("max_grad_norm", 0.0),
        ("target_return", math.nan),
        ("env_id", "NoSuchEnv-v0"),
        ("algo", "weights"),
        ("staleness_scaling", "sqrt"),
        ("seed", -1),
        ("seed", 2**64),
        ("seed", 2**70),
        ("entropy_coef_max", -0.01),
        ("entropy_coef_max", math.inf),
        ("log_std_spread", -0.5),
        ("log_std_spread", 3.5),
        ("log_std_spread", math.nan),
        ("eval_every_updates", 0),
        ("eval_episodes", 0),
        ("eval_episodes", 1001),
        ("solved_on", "test"),
        ("outlier_sigma", 0.0),
        ("outlier_sigma", math.nan),
        ("outlier_warmup", 0),
        ("outlier_warmup", 101),  # more than the window holds: the check would never judge
        ("sync_timeout_s", 0.0),
        ("sync_timeout_s", math.inf),
    ],
)
def test_invalid_value_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        train_config(**{field: value})
    locs = [e["loc"] for e in info.value.errors()]
    assert locs and all(loc[0] == field for loc in locs), locs
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("env_id", "said"),
    [
        ("CartPol-v1", "unknown gymnasium environment 'CartPol-v1'; did you mean 'CartPole-v1'?"),
        ("lunarlander-v2", "did you mean 'LunarLander-v3'?"),
        # Close to nothing registered: most likely a custom environment without its module.
        ("NoSuchEnv-v0", "unknown gymnasium environment 'NoSuchEnv-v0'. A custom environment "
                         "is named module:EnvName-v0"),
    ],
)
def test_unknown_env_message_says_what_was_meant(env_id: str, said: str) -> None:
    with pytest.raises(ValidationError) as info:
        train_config(env_id=env_id)
    (error,) = info.value.errors()
    assert error["loc"] == ("env_id",) and said in error["msg"], error["msg"]
    if "custom" in said:
        assert "A3C_ENV_MODULES" in error["msg"]


@pytest.mark.parametrize(("interval", "timeout"), [(2.0, 2.0), (5.0, 1.0)])
def test_heartbeat_timeout_must_exceed_interval(interval: float, timeout: float) -> None:
    with pytest.raises(ValidationError) as info:
        train_config(heartbeat_interval_s=interval, heartbeat_timeout_s=timeout)
    message = str(info.value)
    assert "heartbeat_timeout_s" in message and "heartbeat_interval_s" in message


def test_heartbeat_timeout_just_above_interval_is_accepted() -> None:
    cfg = train_config(heartbeat_interval_s=2.0, heartbeat_timeout_s=2.5)
    assert cfg.heartbeat_timeout_s == 2.5


def test_solved_on_eval_needs_evaluations() -> None:
    with pytest.raises(ValidationError) as info:
        train_config(solved_on="eval")
    message = str(info.value)
    assert "solved_on" in message and "eval_every_updates" in message
    assert train_config(solved_on="eval", eval_every_updates=5).solved_on == "eval"


def test_lstm_first_gives_each_head_a_torso_so_not_a_shared_one() -> None:
    with pytest.raises(ValidationError, match="and shared_torso one for both"):
        train_config(algo="ppo", core="lstm", lstm_first=True, shared_torso=True)
    assert train_config(algo="ppo", lstm_first=True, core="lstm").lstm_first
    # Without a core there is nothing to put first: the preset's layout does not stop an
    # ablation of the core.
    assert train_config(env_id="a3c_http/CartPoleNoVel-v1", algo="ppo", core="none").lstm_first


def test_a_sync_round_must_end_before_its_workers_look_lost() -> None:
    with pytest.raises(ValidationError, match="sync_timeout_s must be below heartbeat_timeout_s"):
        train_config(algo="a2c", sync_timeout_s=30.0, heartbeat_timeout_s=30.0)
    assert train_config(algo="a2c", sync_timeout_s=29.0).sync_timeout_s == 29.0
    # Other algorithms never wait for a round.
    assert train_config(sync_timeout_s=60.0, heartbeat_timeout_s=30.0).algo == "a3c"


# -- resolved() -----------------------------------------------------------------------------------


def test_resolved_fills_target_return_from_reward_threshold_and_a_seed() -> None:
    cfg = train_config(env_id="CartPole-v1")
    resolved = cfg.resolved()
    assert resolved.target_return == 475.0
    assert isinstance(resolved.seed, int) and 0 <= resolved.seed < 2**31
    # The original is untouched (frozen model, copy on update).
    assert cfg.target_return is None and cfg.seed is None
    # What is saved with a run validates again on resume.
    assert train_config(**resolved.model_dump()) == resolved


def test_resolved_leaves_target_none_for_env_without_threshold() -> None:
    resolved = train_config(env_id="Pendulum-v1", preset=None).resolved()  # the preset sets one
    assert resolved.target_return is None
    assert resolved.seed is not None


def test_resolved_keeps_explicit_values() -> None:
    cfg = train_config(target_return=100.0, seed=7)
    resolved = cfg.resolved()
    assert resolved.target_return == 100.0
    assert resolved.seed == 7
    assert resolved == cfg


# -- the seed's range -----------------------------------------------------------------------------


def test_the_largest_seed_is_accepted_by_every_consumer() -> None:
    """TrainConfig's bound is torch.manual_seed's: the master seeds torch with it as given; the
    workers derive their own (below 2**31) from it, which gymnasium's reset accepts."""
    assert train_config(seed=MAX_SEED).seed == MAX_SEED
    torch.manual_seed(MAX_SEED)
    with pytest.raises(ValueError):  # "Overflow when unpacking long long"
        torch.manual_seed(MAX_SEED + 1)
    from worker.trainer import worker_seed

    derived = worker_seed(MAX_SEED, "w1")
    assert 0 <= derived < 2**31
    env = gym.make("CartPole-v1")
    try:
        env.reset(seed=derived)
    finally:
        env.close()


def test_an_environments_preset_fills_what_the_body_does_not_give() -> None:
    acrobot = train_config(env_id="Acrobot-v1")
    assert acrobot.preset == "Acrobot-v1" and acrobot.normalize_obs and acrobot.normalize_reward
    # What the body gives wins over the preset.
    assert train_config(env_id="Acrobot-v1", normalize_obs=False).normalize_obs is False
    pendulum = train_config(env_id="Pendulum-v1")
    assert (pendulum.gamma, pendulum.t_max, pendulum.target_return) == (0.9, 8, -250.0)
    # CartPole-v1's preset is the default config; null asks for no preset at all.
    assert train_config().preset == "CartPole-v1"
    assert train_config().model_dump(exclude={"preset"}) == train_config(
        preset=None
    ).model_dump(exclude={"preset"})
    plain = train_config(env_id="Pendulum-v1", preset=None)
    assert plain.preset is None and plain.gamma == 0.99
    # A named preset can be applied to another environment; the resolved config keeps its name.
    assert train_config(env_id="MountainCar-v0", preset="Acrobot-v1").normalize_obs
    assert train_config(env_id="MountainCar-v0").preset is None
    # A saved config (every field given) reads back the same.
    assert train_config(**pendulum.model_dump()) == pendulum
    # An Atari game without a preset of its own takes its family's; Pong keeps its own target.
    invaders = train_config(env_id="ALE/SpaceInvaders-v5")
    assert invaders.preset == "ALE/*" and invaders.encoder == "nature_cnn"
    assert invaders.frame_stack == 4 and invaders.target_return is None
    assert train_config(env_id="ALE/Pong-v5").target_return == 18.0
    assert train_config(**invaders.model_dump()) == invaders


def test_an_unknown_preset_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="unknown preset 'Pong'"):
        train_config(preset="Pong")
    for env_id in ({}, [1], None):  # found by the fuzzer: a 500 before presets checked the type
        with pytest.raises(ValidationError, match="env_id"):
            train_config(env_id=env_id)


# -- the sections ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "section", "dropped"),
    [
        (
            {"sync_mode": "sync", "n_epochs": 10, "buffer_size": 9},
            "A2CConfig",
            "buffer_size, n_epochs",
        ),
        ({"sync_mode": "best_weights"}, "BestWeightsConfig", None),
        (
            {"algo": "ppo", "sync_mode": "gradients", "apex_epsilon": 0.4},
            "PPOConfig",
            "apex_epsilon",
        ),
    ],
)
def test_a_config_of_before_opens_as_the_algorithm_it_selected_with_one_note(
    old: dict, section: str, dropped: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """A config of one model of every field (a run folder's config.json of before the
    sections): its sync_mode becomes its algo, the other algorithms' fields are left out, and
    one line says so."""
    with caplog.at_level("WARNING", logger="a3c_http.algos.registry"):
        config = train_config({"env_id": "CartPole-v1", "lr": 0.002, **old})
    assert type(config).__name__ == section and config.lr == 0.002
    assert "sync_mode" not in config.model_dump()
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and f"sync_mode {old['sync_mode']!r} read as algo" in notes[0]
    assert (f"fields of other algorithms ({dropped})" in notes[0]) == (dropped is not None)


def test_a_field_of_another_algorithm_is_refused_with_whose_it_is() -> None:
    with pytest.raises(ValidationError) as info:
        train_config(n_epochs=4, buffer_size=100)
    errors = {e["loc"]: e["msg"] for e in info.value.errors()}
    assert errors == {
        ("n_epochs",): "'n_epochs' is a field of algo 'ppo' or 'impala', not of 'a3c'",
        ("buffer_size",): "'buffer_size' is a field of algo 'dqn' or 'apex' or 'apex_dpg' or "
        "'sac', not of 'a3c'",
    }
    with pytest.raises(ValidationError, match="Input should be one of 'a3c', 'a2c'"):
        train_config(algo="td3")
    # A field no algorithm has keeps the hint of what was meant.
    with pytest.raises(ValidationError, match="unknown field 'ent_coef'"):
        train_config(ent_coef=0.1)


@pytest.mark.parametrize(
    ("fields", "holds"),
    [
        ({"algo": "sac", "env_id": "Pendulum-v1", "buffer_size": 1000}, "replay holds"),
        ({"algo": "dqn", "buffer_size": 1000}, "replay holds"),
        # a team's learners keep 333 each and wait for 334 each
        ({"algo": "apex", "buffer_size": 1000, "learners": 3, "num_envs": 4},
         "replay holds (each of 3 learners keeps 333 and waits for 334)"),
    ],
    ids=["sac", "dqn", "apex-team"],
)
def test_a_replay_that_never_holds_learning_starts_is_refused(fields: dict, holds: str) -> None:
    refused = re.escape(f"learning_starts 1001 is more than the {holds}")
    with pytest.raises(ValidationError, match=refused):
        train_config(**fields, learning_starts=1001)
    train_config(**fields, learning_starts=1000 if "learners" not in fields else 999)


def test_each_section_holds_the_shared_fields_and_its_own_only() -> None:
    shared = set(TrainConfig.model_fields)
    ppo, apex = train_config(algo="ppo"), train_config(algo="apex")
    assert shared <= set(ppo.model_dump()) and shared <= set(apex.model_dump())
    assert "n_epochs" in ppo.model_dump() and "buffer_size" not in ppo.model_dump()
    assert "prioritized_alpha" in apex.model_dump() and "vtrace_lambda" not in apex.model_dump()
