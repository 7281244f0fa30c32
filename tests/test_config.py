"""TrainConfig validation and resolution; Settings read from environment variables."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from pydantic import ValidationError

from a3c_http.config import MAX_SEED, Settings, TrainConfig, WorkerSettings

SETTINGS_VARS = (
    "A3C_TOKEN",
    "A3C_RUN_DIR",
    "A3C_WORKERS_FILE",
    "A3C_MASTER_URL",
    "A3C_PERSIST_INTERVAL_S",
    "A3C_QUEUE_MAX",
    "A3C_MAX_BODY_BYTES",
    "A3C_MASTER_RETRY_S",
    "A3C_TORCH_THREADS",
    "A3C_ALLOWED_HOSTS",
    "A3C_MAX_HEADER_BYTES",
    "A3C_HEADER_TIMEOUT_S",
    "A3C_BODY_TIMEOUT_S",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in SETTINGS_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# -- TrainConfig ----------------------------------------------------------------------------------


def test_defaults_are_valid_and_match_the_contract() -> None:
    cfg = TrainConfig()
    assert cfg.env_id == "CartPole-v1"
    assert cfg.sync_mode == "gradients"
    assert cfg.num_envs >= 1
    assert cfg.hidden_sizes and all(w >= 1 for w in cfg.hidden_sizes)
    assert 0 < cfg.lr <= 1
    assert 0 <= cfg.gamma <= 1
    assert cfg.heartbeat_timeout_s > cfg.heartbeat_interval_s
    assert cfg.target_return is None and cfg.seed is None
    # The defaults survive a JSON round trip, as they do through POST /train.
    assert TrainConfig.model_validate_json(cfg.model_dump_json()) == cfg


def test_config_is_frozen() -> None:
    cfg = TrainConfig()
    with pytest.raises(ValidationError):
        cfg.lr = 0.5  # type: ignore[misc]


def test_unknown_field_is_refused_and_named() -> None:
    with pytest.raises(ValidationError) as info:
        TrainConfig(learning_rate=0.1)
    errors = info.value.errors()
    assert [e["loc"] for e in errors] == [("learning_rate",)]
    assert errors[0]["type"] == "extra_forbidden"


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
        ("hidden_sizes", []),
        ("hidden_sizes", [5000]),
        ("entropy_coef", math.inf),
        ("max_grad_norm", 0.0),
        ("target_return", math.nan),
        ("env_id", "NoSuchEnv-v0"),
        ("sync_mode", "weights"),
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
        TrainConfig(**{field: value})
    locs = [e["loc"] for e in info.value.errors()]
    assert locs and all(loc[0] == field for loc in locs), locs
    assert field in str(info.value)


def test_unknown_env_message_names_the_env() -> None:
    with pytest.raises(ValidationError, match="NoSuchEnv-v0"):
        TrainConfig(env_id="NoSuchEnv-v0")


@pytest.mark.parametrize(("interval", "timeout"), [(2.0, 2.0), (5.0, 1.0)])
def test_heartbeat_timeout_must_exceed_interval(interval: float, timeout: float) -> None:
    with pytest.raises(ValidationError) as info:
        TrainConfig(heartbeat_interval_s=interval, heartbeat_timeout_s=timeout)
    message = str(info.value)
    assert "heartbeat_timeout_s" in message and "heartbeat_interval_s" in message


def test_heartbeat_timeout_just_above_interval_is_accepted() -> None:
    cfg = TrainConfig(heartbeat_interval_s=2.0, heartbeat_timeout_s=2.5)
    assert cfg.heartbeat_timeout_s == 2.5


def test_solved_on_eval_needs_evaluations() -> None:
    with pytest.raises(ValidationError) as info:
        TrainConfig(solved_on="eval")
    message = str(info.value)
    assert "solved_on" in message and "eval_every_updates" in message
    assert TrainConfig(solved_on="eval", eval_every_updates=5).solved_on == "eval"


def test_a_sync_round_must_end_before_its_workers_look_lost() -> None:
    with pytest.raises(ValidationError, match="sync_timeout_s must be below heartbeat_timeout_s"):
        TrainConfig(sync_mode="sync", sync_timeout_s=30.0, heartbeat_timeout_s=30.0)
    assert TrainConfig(sync_mode="sync", sync_timeout_s=29.0).sync_timeout_s == 29.0
    # Other modes never wait for a round.
    assert TrainConfig(sync_timeout_s=60.0, heartbeat_timeout_s=30.0).sync_mode == "gradients"


# -- resolved() -----------------------------------------------------------------------------------


def test_resolved_fills_target_return_from_reward_threshold_and_a_seed() -> None:
    cfg = TrainConfig(env_id="CartPole-v1")
    resolved = cfg.resolved()
    assert resolved.target_return == 475.0
    assert isinstance(resolved.seed, int) and 0 <= resolved.seed < 2**31
    # The original is untouched (frozen model, copy on update).
    assert cfg.target_return is None and cfg.seed is None
    # What is saved with a run validates again on resume.
    assert TrainConfig(**resolved.model_dump()) == resolved


def test_resolved_leaves_target_none_for_env_without_threshold() -> None:
    resolved = TrainConfig(env_id="Pendulum-v1", preset=None).resolved()  # the preset sets one
    assert resolved.target_return is None
    assert resolved.seed is not None


def test_resolved_keeps_explicit_values() -> None:
    cfg = TrainConfig(target_return=100.0, seed=7)
    resolved = cfg.resolved()
    assert resolved.target_return == 100.0
    assert resolved.seed == 7
    assert resolved == cfg


# -- Settings.from_env ----------------------------------------------------------------------------


def test_settings_defaults(clean_env: pytest.MonkeyPatch) -> None:
    s = Settings.from_env()
    assert s == Settings()
    assert s.token is None
    assert s.run_dir == Path("runs/latest")
    assert s.workers_file == Path("workers.txt")
    assert s.master_url is None
    assert s.persist_interval_s == 5.0
    assert s.queue_max == 10_000


def test_settings_from_env_vars(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("A3C_TOKEN", "s3cret")
    clean_env.setenv("A3C_RUN_DIR", str(tmp_path / "run"))
    clean_env.setenv("A3C_WORKERS_FILE", str(tmp_path / "w.txt"))
    clean_env.setenv("A3C_MASTER_URL", "http://10.0.0.1:33333")
    clean_env.setenv("A3C_PERSIST_INTERVAL_S", "0.25")
    clean_env.setenv("A3C_QUEUE_MAX", "50")
    s = Settings.from_env()
    assert s.token == "s3cret"
    assert s.run_dir == tmp_path / "run"
    assert s.workers_file == tmp_path / "w.txt"
    assert s.master_url == "http://10.0.0.1:33333"
    assert s.persist_interval_s == 0.25
    assert s.queue_max == 50
    assert isinstance(s.queue_max, int)


def test_empty_env_vars_mean_unset(clean_env: pytest.MonkeyPatch) -> None:
    for name in SETTINGS_VARS:
        clean_env.setenv(name, "")
    assert Settings.from_env() == Settings()


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "nan", "inf", "5s"])
def test_bad_persist_interval_raises_naming_the_variable(
    clean_env: pytest.MonkeyPatch, raw: str
) -> None:
    clean_env.setenv("A3C_PERSIST_INTERVAL_S", raw)
    with pytest.raises(ValueError, match="A3C_PERSIST_INTERVAL_S"):
        Settings.from_env()


def test_bad_queue_max_raises(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("A3C_QUEUE_MAX", "-3")
    with pytest.raises(ValueError, match="A3C_QUEUE_MAX"):
        Settings.from_env()


def test_fractional_queue_max_below_one_is_refused(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("A3C_QUEUE_MAX", "0.5")
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        assert "A3C_QUEUE_MAX" in str(exc)
    else:
        assert settings.queue_max >= 1


def test_settings_take_keyword_arguments(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = Settings(run_dir=tmp_path / "run", workers_file=tmp_path / "w.txt", token="t")
    assert (s.run_dir, s.workers_file, s.token) == (tmp_path / "run", tmp_path / "w.txt", "t")
    assert s.queue_max == 10_000 and s.max_body_bytes == 32 * 1024 * 1024


def test_keyword_arguments_are_validated_too(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="queue_max"):
        Settings(queue_max=0)
    with pytest.raises(ValueError, match="no_such_setting"):
        Settings(no_such_setting=1)


def test_bad_master_url_is_refused_at_start(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("A3C_MASTER_URL", "10.0.0.1:33333")
    with pytest.raises(ValueError, match="A3C_MASTER_URL='10.0.0.1:33333'"):
        Settings.from_env()


# -- the worker's settings ------------------------------------------------------------------------


def test_worker_settings_defaults(clean_env: pytest.MonkeyPatch) -> None:
    s = WorkerSettings.from_env()
    assert s == WorkerSettings()
    assert s.token is None
    assert s.master_retry_s == 60.0
    assert s.torch_threads == 1
    assert s.max_body_bytes == 32 * 1024 * 1024


def test_worker_settings_from_env_vars(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("A3C_TOKEN", "s3cret")
    clean_env.setenv("A3C_MASTER_RETRY_S", "2.5")
    clean_env.setenv("A3C_TORCH_THREADS", "3")
    clean_env.setenv("A3C_MAX_BODY_BYTES", "4096")
    s = WorkerSettings.from_env()
    assert (s.token, s.master_retry_s, s.torch_threads, s.max_body_bytes) == (
        "s3cret",
        2.5,
        3,
        4096,
    )


@pytest.mark.parametrize(
    ("settings", "name", "raw"),
    [
        (WorkerSettings, "A3C_TORCH_THREADS", "abc"),
        (WorkerSettings, "A3C_TORCH_THREADS", "0"),
        (WorkerSettings, "A3C_TORCH_THREADS", "1.5"),
        (WorkerSettings, "A3C_MASTER_RETRY_S", "soon"),
        (WorkerSettings, "A3C_MASTER_RETRY_S", "-1"),
        (WorkerSettings, "A3C_MASTER_RETRY_S", "inf"),
        (WorkerSettings, "A3C_MAX_BODY_BYTES", "12"),
        (WorkerSettings, "A3C_MAX_BODY_BYTES", "1e6"),
        (Settings, "A3C_MAX_BODY_BYTES", "lots"),
        (Settings, "A3C_PERSIST_INTERVAL_S", "abc"),
        (Settings, "A3C_QUEUE_MAX", "-3"),
        (WorkerSettings, "A3C_MAX_HEADER_BYTES", "100"),
        (Settings, "A3C_HEADER_TIMEOUT_S", "0"),
        (WorkerSettings, "A3C_BODY_TIMEOUT_S", "inf"),
        (Settings, "A3C_ALLOWED_HOSTS", "http://a3c.example:33333"),
    ],
)
def test_a_bad_setting_is_one_line_that_names_the_variable_and_its_value(
    clean_env: pytest.MonkeyPatch, settings: type, name: str, raw: str
) -> None:
    clean_env.setenv(name, raw)
    with pytest.raises(ValueError) as info:
        settings.from_env()
    message = str(info.value)
    assert f"{name}={raw!r}" in message
    assert "\n" not in message, message


def test_the_edge_settings_default_and_read_the_allowed_hosts_as_names(
    clean_env: pytest.MonkeyPatch,
) -> None:
    s = WorkerSettings.from_env()
    assert s.allowed_hosts == ()
    assert (s.max_header_bytes, s.header_timeout_s, s.body_timeout_s) == (65536, 10.0, 60.0)
    clean_env.setenv("A3C_ALLOWED_HOSTS", " a3c.example, Dash.Example.,,[::1],10.0.0.7 ")
    assert Settings.from_env().allowed_hosts == ("a3c.example", "dash.example", "::1", "10.0.0.7")


@pytest.mark.parametrize(
    "token", ["two words", "tökén", "tab\there", "line\nbreak", "del\x7f", " padded"]
)
def test_a_token_is_printable_ascii_without_spaces(
    clean_env: pytest.MonkeyPatch, token: str
) -> None:
    clean_env.setenv("A3C_TOKEN", token)
    with pytest.raises(ValueError) as info:
        WorkerSettings.from_env()
    message = str(info.value)
    assert message.startswith("A3C_TOKEN: ") and "printable ASCII without spaces" in message
    assert token.strip() not in message and "\n" not in message  # a secret stays out of logs
    clean_env.setenv("A3C_TOKEN", "Ab0-_.~!#$%&'*+/=?^`|:;<>@[]{}()\"")
    assert Settings.from_env().token == "Ab0-_.~!#$%&'*+/=?^`|:;<>@[]{}()\""


def test_a_bad_token_stops_the_worker_with_one_line(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("A3C_TOKEN", "pässword")
    import worker.app

    with pytest.raises(SystemExit) as info:
        worker.app.__getattr__("app")
    assert str(info.value) == (
        "a3c-http worker: A3C_TOKEN: Value error, must be printable ASCII without spaces "
        "(it travels in a header)"
    )


def test_every_bad_setting_is_named_at_once(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("A3C_TORCH_THREADS", "abc")
    clean_env.setenv("A3C_MASTER_RETRY_S", "soon")
    with pytest.raises(ValueError) as info:
        WorkerSettings.from_env()
    assert "A3C_TORCH_THREADS='abc'" in str(info.value)
    assert "A3C_MASTER_RETRY_S='soon'" in str(info.value)


# -- the seed's range -----------------------------------------------------------------------------


def test_the_largest_seed_is_accepted_by_every_consumer() -> None:
    """TrainConfig's bound is torch.manual_seed's: the master seeds torch with it as given; the
    workers derive their own (below 2**31) from it, which gymnasium's reset accepts."""
    assert TrainConfig(seed=MAX_SEED).seed == MAX_SEED
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
    acrobot = TrainConfig(env_id="Acrobot-v1")
    assert acrobot.preset == "Acrobot-v1" and acrobot.normalize_obs and acrobot.normalize_reward
    # What the body gives wins over the preset.
    assert TrainConfig(env_id="Acrobot-v1", normalize_obs=False).normalize_obs is False
    pendulum = TrainConfig(env_id="Pendulum-v1")
    assert (pendulum.gamma, pendulum.t_max, pendulum.target_return) == (0.9, 8, -250.0)
    # CartPole-v1's preset is the default config; null asks for no preset at all.
    assert TrainConfig().preset == "CartPole-v1"
    assert TrainConfig().model_dump(exclude={"preset"}) == TrainConfig(
        preset=None
    ).model_dump(exclude={"preset"})
    plain = TrainConfig(env_id="Pendulum-v1", preset=None)
    assert plain.preset is None and plain.gamma == 0.99
    # A named preset can be applied to another environment; the resolved config keeps its name.
    assert TrainConfig(env_id="MountainCar-v0", preset="Acrobot-v1").normalize_obs
    assert TrainConfig(env_id="MountainCar-v0").preset is None
    # A saved config (every field given) reads back the same.
    assert TrainConfig(**pendulum.model_dump()) == pendulum


def test_an_unknown_preset_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="unknown preset 'Pong'"):
        TrainConfig(preset="Pong")
    for env_id in ({}, [1], None):  # found by the fuzzer: a 500 before presets checked the type
        with pytest.raises(ValidationError, match="env_id"):
            TrainConfig(env_id=env_id)
