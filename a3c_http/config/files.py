"""Training configs as files: read a TOML or JSON file (or an inline JSON object) into the body of
`POST /train`, read a run's saved config, and write a config as TOML.

A config file holds the fields of the training config (a3c_http/config/training.py and the
section of its `algo`, a3c_http/algos/<algo>/config.py), as the JSON body of `POST /train` does;
TOML tables are the dict fields (`[env_kwargs]`). TOML has no null: a field to set to null
(`max_steps`, `outlier_sigma`, `preset`) is listed in `unset = [...]`. The `config.json` a master
saves in a run folder is read as it is: its `run_id` is the run's own and is left out, and the
fields an earlier version did not save get what they meant then (`saved_fields`).

Nothing here validates values: the master does, and a file names a run that another host's
master may validate with packages this host lacks. Unknown field names are caught here, with
what was meant (a3c_http/config/hints.py), so a misspelt file stops before anything starts.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import tomllib
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from a3c_http.algos.registry import LEGACY_FIELDS, owners, train_config
from a3c_http.config.hints import unknown_field
from a3c_http.config.presets import preset_of
from a3c_http.config.training import TrainConfig
from a3c_http.server.service import describe_error
from a3c_http.store.runstore import DB, RunStore, Snapshot

# The other fields of POST /train's body (master/api/schemas.py, TrainIn): where the workers are and
# how they reach the master.
BODY_FIELDS = ("workers", "master_url")
# TOML has no null: a file lists the fields it sets to null here.
UNSET = "unset"

# What a field added since a run was saved meant before it existed: a run folder of an earlier
# version resumes with the network and optimizer it was saved with (a shared torso and Adam), its
# tensors on the wire as they were (float32), and no preset fills in what that version did not
# know.
BEFORE_THE_FIELD: dict[str, Any] = {
    "preset": None,
    "shared_torso": True,
    "optimizer": "adam",
    "wire_dtype": "float32",
}
# What a saved config holds that is not a field: the run's own id (a new run gets its own).
DERIVED_FIELDS = ("run_id",)


def saved_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The fields of a saved run's config (config.json, or the run folder's database), without
    its run id, and with what an earlier version meant by each field it did not save."""
    fields = {k: v for k, v in data.items() if k not in DERIVED_FIELDS}
    return {**BEFORE_THE_FIELD, **fields}


def saved_config(data: dict[str, Any]) -> TrainConfig:
    """The config of a saved run, as it was saved (also by an earlier version): the master
    resuming it (master/persistence/resume.py), evaluation, export (a3c_http/policy/export.py) and
    the config files here read it so. A config of before the algorithms' sections is upgraded
    (a3c_http/algos/registry.py `upgrade`)."""
    return train_config(saved_fields(data))


class RunFolderError(ValueError):
    """A folder that is not a run folder with weights, or whose saved run does not read; `str()`
    is one line that says which and why."""


def read_run(run_dir: Path) -> tuple[TrainConfig, Snapshot]:
    """A run folder's saved config and its last save (weights, state), for the commands that
    use a finished or running run: `a3c-evaluate`, `a3c-export`. RunFolderError says what is
    wrong."""
    if not run_dir.is_dir():
        raise RunFolderError(f"{run_dir}: no such folder")
    if not (run_dir / DB).is_file():
        raise RunFolderError(f"{run_dir}: not a run folder (no {DB}; e.g. runs/latest)")
    try:
        snap = RunStore(run_dir).load()
    except (sqlite3.Error, OSError, ValueError) as exc:  # ValueError: a config that is not JSON
        raise RunFolderError(f"{run_dir / DB}: cannot be read ({exc})") from None
    if snap is None:
        raise RunFolderError(f"{run_dir}: the run folder holds no run yet")
    if not snap.weights:
        raise RunFolderError(
            f"{run_dir}: the run has no weights yet (the master saves them first)"
        )
    try:
        return saved_config(snap.config), snap
    except ValidationError as exc:
        why = describe_error(exc.errors()[0], "config")
        env_id = snap.config.get("env_id")
        module = env_id.rpartition(":")[0] if isinstance(env_id, str) else ""
        if module and ("A3C_ENV_MODULES" in why or "cannot import" in why):
            why += (
                f". The run's environment is in module {module!r}: here too it must be "
                f"importable (installed, or its folder on PYTHONPATH) and A3C_ENV_MODULES must "
                f"name it, as on the master and the workers"
            )
        raise RunFolderError(f"{run_dir}: its saved config does not load: {why}") from None


class ConfigFileError(ValueError):
    """A config file (or inline JSON) that cannot be read: the message is one line that names it
    and what is wrong."""


def load(source: str) -> dict[str, Any]:
    """The body of `POST /train` that `source` gives: a JSON object written inline (it starts
    with `{`), or the path of a .toml or .json file. A .json file that holds a `run_id` is a
    run's saved config (`saved_fields`)."""
    if source.lstrip().startswith("{"):
        return _checked(_json(source, "--config"), "--config")
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigFileError(
            f"{source}: no such file (--config takes a .toml or .json file, or a JSON object "
            "such as '{\"seed\": 1}')"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{source}: cannot read it ({exc})") from None
    if path.suffix.lower() == ".json":
        data = _json(text, source)
        if "run_id" in data:
            data = saved_fields(data)
        return _checked(data, source)
    if path.suffix.lower() != ".toml":
        raise ConfigFileError(f"{source}: a config file is .toml or .json")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{source}: not valid TOML: {exc}") from None
    _no_dates(data, source, [])
    return _checked(_unset(data, source), source)


def _json(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigFileError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{where}: expected a JSON object of config fields")
    return data


def _no_dates(value: Any, where: str, path: list[str]) -> None:
    """TOML's dates and times, which no field holds and JSON cannot carry."""
    if isinstance(value, (datetime, date, time)):
        raise ConfigFileError(f"{where}: {'.'.join(path)}: a date or time, which no field holds")
    if isinstance(value, dict):
        for key, item in value.items():
            _no_dates(item, where, [*path, key])
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _no_dates(item, where, [*path, str(i)])


def _unset(data: dict[str, Any], where: str) -> dict[str, Any]:
    names = data.pop(UNSET, [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigFileError(
            f'{where}: {UNSET} must be a list of field names, e.g. {UNSET} = ["max_steps"]'
        )
    for name in names:
        if name in data:
            raise ConfigFileError(f"{where}: {name} is both given and listed in {UNSET}")
    return {**data, **dict.fromkeys(names)}


def _checked(data: dict[str, Any], where: str) -> dict[str, Any]:
    known = [*owners(), *BODY_FIELDS, *LEGACY_FIELDS]
    unknown = [name for name in data if name not in known]
    if unknown:
        raise ConfigFileError(f"{where}: " + "; ".join(unknown_field(n, known) for n in unknown))
    return data


# -- writing ------------------------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class TomlError(ValueError):
    """A value that TOML cannot hold (a None inside a list or a table: TOML has no null)."""


def config_toml(config: TrainConfig, header: str = "", extra: dict[str, Any] | None = None) -> str:
    """`config` as a TOML file that `load` reads back to the same config: every field in the
    model's order, a None as its absence where that reads back as None, else in `unset`; then
    `extra`, other fields of the body (BODY_FIELDS)."""
    data = config.model_dump()
    unset = [
        name for name, value in data.items() if value is None and not _absent_is_none(config, name)
    ]
    fields = {name: value for name, value in data.items() if value is not None}
    fields.update(extra or {})
    if unset:
        fields[UNSET] = unset
    return to_toml(fields, header)


def _absent_is_none(config: TrainConfig, name: str) -> bool:
    """Whether leaving `name` out of a file gives None: its default is None, and for `preset`,
    env_id has no preset of its own (which an absent preset takes)."""
    if name == "preset":
        return preset_of(config.env_id, type(config).presets) is None
    return type(config).model_fields[name].default is None


def to_toml(data: dict[str, Any], header: str = "") -> str:
    """A TOML document of `data` (str, int, float, bool, lists, and dicts as tables; no None),
    keys in their order, plain values before tables; `header` as comment lines on top."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    _table(data, [], lines)
    return "\n".join(lines).strip("\n") + "\n"


def _table(data: dict[str, Any], path: list[str], lines: list[str]) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, dict) and v}
    if path and (len(tables) < len(data) or not data):
        lines += ["", f"[{'.'.join(_key(p) for p in path)}]"]
    for key, value in data.items():
        if key not in tables:
            lines.append(f"{_key(key)} = {_value(value, [*path, key])}")
    for key, value in tables.items():
        _table(value, [*path, key], lines)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    # JSON's escapes are TOML's; DEL is a control character to TOML and not to JSON.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any, path: list[str]) -> str:
    if value is None:
        raise TomlError(f"{'.'.join(path)} is null, which TOML cannot write")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # always with a "." or an exponent: read back as this float
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v, [*path, str(i)]) for i, v in enumerate(value)) + "]"
    if isinstance(value, dict):
        items = (f"{_key(k)} = {_value(v, [*path, k])}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise TomlError(f"{'.'.join(path)}: cannot write a {type(value).__name__} as TOML")
