"""The settings read from environment variables (a3c_http/config/training.py `Settings`,
`WorkerSettings`): defaults, values, and a bad one refused at start in one line that names it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from a3c_http.config.settings import Settings, WorkerSettings
from tests.support.badpeer import without_proxies

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
    "A3C_PROXY_FROM_ENV",
    "A3C_MAX_WORKERS",
    "A3C_WANDB_PROJECT",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in SETTINGS_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


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
    assert s.max_workers == 1024


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
    assert s.proxy_from_env is False


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


def test_a_wandb_project_without_the_wandb_package_stops_the_master_with_one_line(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("A3C_RUN_DIR", str(tmp_path / "run"))
    clean_env.setenv("A3C_WANDB_PROJECT", "a3c")
    clean_env.setitem(sys.modules, "wandb", None)  # what an import finds of a missing package
    import master.app

    with pytest.raises(SystemExit) as info:
        master.app.__getattr__("app")
    assert str(info.value) == (
        "a3c-http master: A3C_WANDB_PROJECT='a3c': Value error, the wandb package is not "
        "installed: install the `wandb` extra (./scripts/setup_venv.sh wandb, or pip install "
        "'a3c-http[wandb]')"
    )
    assert not (tmp_path / "run").exists()
    clean_env.setenv("A3C_WANDB_PROJECT", "team/a3c")
    with pytest.raises(ValueError, match="A3C_WANDB_PROJECT='team/a3c': String should match"):
        Settings.from_env()


def test_every_bad_setting_is_named_at_once(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("A3C_TORCH_THREADS", "abc")
    clean_env.setenv("A3C_MASTER_RETRY_S", "soon")
    with pytest.raises(ValueError) as info:
        WorkerSettings.from_env()
    assert "A3C_TORCH_THREADS='abc'" in str(info.value)
    assert "A3C_MASTER_RETRY_S='soon'" in str(info.value)


def test_a_proxy_that_cannot_be_used_stops_a_service_only_when_proxies_are_asked_for(
    clean_env: pytest.MonkeyPatch,
) -> None:
    without_proxies(clean_env)
    clean_env.setenv("ALL_PROXY", "socks5://10.0.0.1:1080")
    assert Settings.from_env().proxy_from_env is False  # not asked for: the proxy is ignored
    clean_env.setenv("A3C_PROXY_FROM_ENV", "true")
    with pytest.raises(ValueError) as info:
        WorkerSettings.from_env()
    assert str(info.value).startswith("A3C_PROXY_FROM_ENV='true': ")
    assert "ALL_PROXY='socks5://10.0.0.1:1080': only http:// and https://" in str(info.value)


def test_a_token_file_gives_its_token_without_the_final_newline(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret-token\n")  # as echo and kubectl create secret --from-file leave it
    clean_env.setenv("A3C_TOKEN_FILE", str(secret))
    assert WorkerSettings.from_env().token == Settings.from_env().token == "s3cret-token"
    for text, problem in (("two words\n", "printable ASCII"), ("\n", "printable ASCII")):
        secret.write_text(text)
        with pytest.raises(ValueError, match=problem) as info:
            Settings.from_env()
        assert "two words" not in str(info.value)  # a secret stays out of logs
    clean_env.setenv("A3C_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="A3C_TOKEN_FILE=.*missing.*cannot read it"):
        Settings.from_env()
    clean_env.setenv("A3C_TOKEN", "other")
    with pytest.raises(ValueError, match="both set: keep one"):
        Settings.from_env()


# The settings renamed since, by their new names: their old ones still work.
RENAMED = {"A3C_RECEIVERS": "A3C_FRONTS", "A3C_RECEIVERS_BIND": "A3C_FRONTS_BIND"}  # old names


def test_the_old_names_of_renamed_settings_still_work(clean_env: pytest.MonkeyPatch) -> None:
    for new, old in RENAMED.items():
        clean_env.delenv(new, raising=False)
        clean_env.delenv(old, raising=False)
    clean_env.setenv(RENAMED["A3C_RECEIVERS"], "2")
    clean_env.setenv(RENAMED["A3C_RECEIVERS_BIND"], "127.0.0.1:33334")
    old = Settings.from_env()
    assert (old.receivers, old.receivers_bind) == (2, "127.0.0.1:33334")
    assert Settings(receivers=2, receivers_bind="127.0.0.1:33334") == old  # by the fields' names
    # The same values under both names are one setting.
    clean_env.setenv("A3C_RECEIVERS", "2")
    assert Settings.from_env() == old
    # An error names the variable that was set, the old name too.
    clean_env.delenv("A3C_RECEIVERS")
    clean_env.setenv(RENAMED["A3C_RECEIVERS"], "many")
    with pytest.raises(ValueError) as info:
        Settings.from_env()
    assert str(info.value).startswith(f"{RENAMED['A3C_RECEIVERS']}='many': ")
    clean_env.setenv(RENAMED["A3C_RECEIVERS"], "2")
    clean_env.delenv(RENAMED["A3C_RECEIVERS_BIND"])
    with pytest.raises(ValueError, match=f"^{RENAMED['A3C_RECEIVERS']} needs A3C_RECEIVERS_BIND"):
        Settings.from_env()
    # Both names set to different values: refused, in one line.
    clean_env.setenv("A3C_RECEIVERS", "3")
    with pytest.raises(ValueError) as info:
        Settings.from_env()
    message = str(info.value)
    assert "A3C_RECEIVERS='3' and " in message and "(its old name) are both set" in message
    assert "\n" not in message
