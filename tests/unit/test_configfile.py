"""Config files (a3c_http/config/files.py, `a3c-train --config` and `--print-config`): TOML and JSON
files read into the body of POST /train, a run's saved config.json read as such a file, configs
written as TOML that reads back to the same config, and a bad file as one line that names it."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest

from a3c_http.algos.registry import CONFIGS, train_config
from a3c_http.cli.train import evaluate_command, main, printed_config, run_config
from a3c_http.config import files as configfile
from a3c_http.config.files import ConfigFileError, TomlError, config_toml, load, to_toml
from a3c_http.config.settings import Settings
from a3c_http.config.training import TrainConfig
from master.state import ClusterState


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def as_run(fields: dict) -> TrainConfig:
    """The config the master runs for a body of config fields (its seed left as given)."""
    config = train_config(**fields)
    return config.resolved().model_copy(update={"seed": config.seed})


@pytest.mark.parametrize(
    ("algo", "env_id"),
    [(algo, env_id) for algo, s in CONFIGS.items() for env_id in s.presets if "*" not in env_id],
)
def test_every_preset_prints_as_toml_that_reads_back_to_the_same_config(
    algo: str, env_id: str, tmp_path: Path
) -> None:
    """Each algorithm's presets: its own section's fields, printed and read back."""
    body = {"algo": algo, "env_id": env_id}
    text = printed_config(body)
    back = load(write(tmp_path / "run.toml", text))
    assert as_run(back) == as_run(body)
    assert back["env_id"] == env_id and back["preset"] == env_id and back["algo"] == algo
    given = {k for k, v in as_run(body).model_dump().items() if v is not None}
    assert set(back) == given  # every field but those left None (the seed among them)


def test_nulls_are_written_as_absent_fields_or_in_unset(tmp_path: Path) -> None:
    """TOML has no null: a None whose absence reads back as None is left out; max_steps,
    outlier_sigma and the preset of an environment that has one are listed in `unset`."""
    config = train_config(
        env_id="Acrobot-v1",
        preset=None,
        max_steps=None,
        outlier_sigma=None,
        max_episodes=None,
        seed=3,
    )
    text = config_toml(config)
    assert tomllib.loads(text)["unset"] == ["preset", "max_steps", "outlier_sigma"]
    assert "max_episodes" not in text
    back = train_config(**load(write(tmp_path / "run.toml", text)))
    assert back == config and not back.normalize_obs  # no preset crept in


def test_the_toml_writer_writes_what_tomllib_reads_back() -> None:
    data = {
        "text": 'quotes " and \\ backslash\nnew line\ttab \x7f del \x01 é 😀',
        "int": -3,
        "big": 2**64 - 1,
        "floats": [0.1, 1e-05, 1e16, -0.0, 2.5e-300],
        "yes": True,
        "empty": {},
        "mixed": [1, "a", [2, 3], {"k": False}],
        "odd key": 1,
        "table": {"a": 1, "nested": {"b": [1.5], "deeper": {"c": "d"}}},
        "only_tables": {"x": {"y": 1}},
    }
    assert tomllib.loads(to_toml(data, "a header\nof two lines")) == data
    special = tomllib.loads(to_toml({"a": math.inf, "b": -math.inf, "c": math.nan}))
    assert special["a"] == math.inf and special["b"] == -math.inf and math.isnan(special["c"])
    with pytest.raises(TomlError, match=r"env_kwargs\.render_mode is null"):
        to_toml({"env_kwargs": {"render_mode": None}})


def test_a_runs_saved_config_json_is_a_config_file_as_it_is(tmp_path: Path) -> None:
    """Its run_id (the run's own) is left out; everything else, the seed included, is the run's,
    and an earlier version's file gets what its missing fields meant then."""
    state = ClusterState(Settings(run_dir=tmp_path / "run"))
    state.start_run(train_config(env_id="Acrobot-v1", lr=1e-3).resolved(), ["http://127.0.0.1:9"])
    state.persist(force=True)
    state.close()
    saved = tmp_path / "run" / "config.json"
    body = load(str(saved))
    assert "run_id" not in body and "run_id" in json.loads(saved.read_text())
    assert train_config(**body) == configfile.saved_config(json.loads(saved.read_text()))
    assert train_config(**body).lr == 1e-3 and train_config(**body).normalize_obs

    old = {k: v for k, v in json.loads(saved.read_text()).items()
           if k not in ("preset", "shared_torso", "optimizer", "normalize_obs")}  # fmt: skip
    body = load(write(tmp_path / "old.json", json.dumps(old)))
    assert body["shared_torso"] is True and body["optimizer"] == "adam"
    assert not train_config(**body).normalize_obs  # Acrobot-v1's preset does not creep in


def test_flags_and_later_files_win_field_by_field(tmp_path: Path) -> None:
    toml = write(tmp_path / "run.toml", 'env_id = "Pendulum-v1"\nlr = 0.001\nt_max = 8\n'
                 "[env_kwargs]\ng = 9.81\n")  # fmt: skip
    body = run_config([toml, '{"lr": 0.002}'], env="Acrobot-v1")
    assert body == {"env_id": "Acrobot-v1", "lr": 0.002, "t_max": 8, "env_kwargs": {"g": 9.81}}
    printed = tomllib.loads(printed_config(body))
    assert printed["normalize_obs"] is True  # Acrobot-v1's preset fills what no one gave
    assert printed["t_max"] == 8 and printed["gamma"] == 0.99  # not Pendulum-v1's 0.9


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("syntax.toml", 'lr = 0.001\nenv_id = "CartPole-v1\n', r"not valid TOML: .*line 2"),
        (
            "unknown.toml",
            "learning_rate = 0.001\n",
            r"unknown field 'learning_rate': did you "
            r"mean 'lr'\?",
        ),
        ("typo.json", '{"gama": 0.9}', r"unknown field 'gama': did you mean 'gamma'\?"),
        ("list.json", "[1, 2]", "expected a JSON object"),
        ("broken.json", '{"lr": }', "not valid JSON: Expecting value: line 1 column 8"),
        ("date.toml", "seed = 1979-05-27\n", "seed: a date or time"),
        ("both.toml", 'max_steps = 5\nunset = ["max_steps"]\n', "both given and listed in unset"),
        ("unset.toml", 'unset = "max_steps"\n', "unset must be a list of field names"),
        ("run.yaml", "lr: 0.001\n", r"a config file is \.toml or \.json"),
    ],
)
def test_a_bad_file_is_one_line_that_names_it_and_exit_code_2(
    name: str, text: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = write(tmp_path / name, text)
    with pytest.raises(ConfigFileError, match=problem) as caught:
        load(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert main(["--config", path, "--print-config"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: {caught.value}\n"


def test_inline_json_and_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert load(' {"seed": 3}') == {"seed": 3}
    with pytest.raises(ConfigFileError, match=r"^--config: not valid JSON"):
        load('{"seed": }')
    with pytest.raises(ConfigFileError, match=r"nothere\.toml: no such file"):
        load(str(tmp_path / "nothere.toml"))
    # A value the master would refuse: --print-config validates, and says what is wrong.
    assert main(["--config", '{"lr": -1}', "--print-config"]) == 2
    assert capsys.readouterr().err == "error: lr: Input should be greater than 0\n"


def test_print_config_writes_what_config_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["--env", "Acrobot-v1", "--config", '{"seed": 5}', "--print-config"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# ") and 'env_id = "Acrobot-v1"' in text and "seed = 5" in text
    path = write(tmp_path / "acrobot.toml", text)
    assert main(["--config", path, "--print-config"]) == 0
    assert capsys.readouterr().out == text


def test_the_other_fields_of_the_body_print_before_the_tables(tmp_path: Path) -> None:
    body = {"workers": ["127.0.0.1:8001"], "env_kwargs": {"max_episode_steps": 100}}
    back = load(write(tmp_path / "run.toml", printed_config(body)))
    assert back["workers"] == ["127.0.0.1:8001"] and back["env_kwargs"] == body["env_kwargs"]
    assert "workers" not in back["env_kwargs"]


def test_the_watch_it_play_line_carries_what_makes_an_own_environment_importable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("A3C_ENV_MODULES", "my_envs")
    monkeypatch.setenv("PYTHONPATH", "/home/me/envs dir")
    plain = evaluate_command("CartPole-v1")
    assert "A3C_ENV_MODULES" not in plain
    assert evaluate_command("my_envs:Crawl-v0") == (
        f"A3C_ENV_MODULES=my_envs PYTHONPATH='/home/me/envs dir' {plain}"
    )
