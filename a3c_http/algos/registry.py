"""The algorithms of the cluster, one line each, and how a config finds its own.

A run's config is its algorithm's section (a3c_http/algos/<algo>/config.py), chosen by its `algo`:
`train_config` builds it from a body, a config file or a run folder's config.json, and the section
names the algorithm class (`algorithm_class`). Nothing outside this folder asks an algorithm's
name; it asks the section or the class. Importing this module imports no torch: the algorithm
classes are imported on first use.

A config of before the sections (one model of every field, `sync_mode` beside `algo`) still
opens: `upgrade` reads its `sync_mode` as the algorithm it selected (gradients: a3c, sync: a2c,
best_weights: best_weights) and leaves out the fields of other algorithms, and says so once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator, ValidationError, WithJsonSchema
from pydantic_core import InitErrorDetails, PydanticCustomError

from a3c_http.algos.a2c.config import A2CConfig
from a3c_http.algos.a3c.config import A3CConfig
from a3c_http.algos.apex.config import ApexConfig
from a3c_http.algos.apex_dpg.config import ApexDPGConfig
from a3c_http.algos.best_weights.config import BestWeightsConfig
from a3c_http.algos.dqn.config import DQNConfig
from a3c_http.algos.impala.config import ImpalaConfig
from a3c_http.algos.ppo.config import PPOConfig
from a3c_http.algos.sac.config import SACConfig
from a3c_http.config.training import TrainConfig

if TYPE_CHECKING:
    from torch import nn

    from a3c_http.algos.base import Algorithm

log = logging.getLogger(__name__)

# Every algorithm's config section, one line each, by its `algo`.
SECTIONS: tuple[type[TrainConfig], ...] = (
    A3CConfig,
    A2CConfig,
    BestWeightsConfig,
    PPOConfig,
    ImpalaConfig,
    DQNConfig,
    ApexConfig,
    ApexDPGConfig,
    SACConfig,
)
CONFIGS: dict[str, type[TrainConfig]] = {
    section.model_fields["algo"].default: section for section in SECTIONS
}
DEFAULT_ALGO = "a3c"



# A config of before the sections: its sync_mode's algorithm.
LEGACY_SYNC_MODES = {"gradients": "a3c", "sync": "a2c", "best_weights": "best_weights"}
# The fields a config of before may hold that no section has (`upgrade` reads them).
LEGACY_FIELDS = ("sync_mode",)


def config_class(algo: str) -> type[TrainConfig]:
    """The config section of `algo`; KeyError for an unknown one."""
    return CONFIGS[algo]


def owners() -> dict[str, list[str]]:
    """Every field of any section, with the algorithms whose sections have it."""
    found: dict[str, list[str]] = {}
    for algo, section in CONFIGS.items():
        for name in section.model_fields:
            found.setdefault(name, []).append(algo)
    return found


def upgrade(data: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A body as today's sections read it, and the note of what changed (None: nothing). A body
    with `sync_mode` is one of before: its `sync_mode` becomes its `algo` (for algo a3c), and
    the fields its algorithm's section does not have are left out."""
    body = dict(data)
    if "sync_mode" not in body:
        return body, None
    mode = body.pop("sync_mode")
    algo = body.get("algo", DEFAULT_ALGO)
    if algo == DEFAULT_ALGO and mode in LEGACY_SYNC_MODES:
        algo = body["algo"] = LEGACY_SYNC_MODES[mode]
    elif algo == DEFAULT_ALGO or mode != "gradients":
        body["sync_mode"] = mode  # not what a config of before had: refused as it is
        return body, None
    section = CONFIGS.get(algo) if isinstance(algo, str) else None
    if section is None:
        return body, None  # an unknown algo: its own 422
    dropped = sorted(name for name in body if name not in section.model_fields)
    for name in dropped:
        del body[name]
    note = (
        f"a config of before the algorithms' own sections: sync_mode {mode!r} read as algo "
        f"{algo!r}"
    )
    if dropped:
        note += f"; left out the {len(dropped)} fields of other algorithms ({', '.join(dropped)})"
    return body, note


def train_config(data: Mapping[str, Any] | None = None, /, **fields: Any) -> TrainConfig:
    """The config of `data` and `fields` (absent `algo`: a3c), as its algorithm's section;
    pydantic's ValidationError names what is wrong. A config of before is upgraded (`upgrade`)
    and logged once at WARNING."""
    config, note = read_config({**(data or {}), **fields})
    if note:
        log.warning("%s", note)
    return config


def read_config(
    data: Mapping[str, Any], *, strict: bool = False
) -> tuple[TrainConfig, str | None]:
    """`train_config` without the log: the config and the upgrade's note, for the caller to
    say where it fits (the reply of POST /train, the resume's log line). `strict`: no value
    converted (a JSON body's "1" is not the int 1)."""
    if not isinstance(data, Mapping):
        raise _error("model_type", (), data, "the config must be an object of fields")
    body, note = upgrade(data)
    if "sync_mode" in body:  # not one of a config of before
        modes = ", ".join(f"{mode}: {algo}" for mode, algo in LEGACY_SYNC_MODES.items())
        raise _error(
            "extra_forbidden",
            ("sync_mode",),
            body["sync_mode"],
            f"sync_mode is gone: `algo` alone selects the algorithm (sync_mode {modes}); a "
            "config of before with its algo's own sync_mode still opens",
        )
    algo = body.get("algo", DEFAULT_ALGO)
    section = CONFIGS.get(algo) if isinstance(algo, str) else None
    if section is None:
        known = ", ".join(repr(a) for a in CONFIGS)
        raise _error("literal_error", ("algo",), algo, f"Input should be one of {known}")
    try:
        return section.model_validate(body, strict=strict), note
    except ValidationError as exc:
        raise _with_owners(exc, algo) from None


def section_schemas() -> list[dict[str, Any]]:
    """The JSON schema of each section (for /openapi.json and the reference). Each requires its
    `algo` but the default algorithm's, so that a body matches the one section it is read as."""
    schemas = []
    for algo, section in CONFIGS.items():
        one = section.model_json_schema()
        if algo != DEFAULT_ALGO:
            one["required"] = ["algo", *one.get("required", [])]
        schemas.append(one)
    return schemas


def config_json(text: str | bytes) -> TrainConfig:
    """The config of a JSON text (`TrainConfig.model_dump_json`'s)."""
    return train_config(json.loads(text))


def algorithm_class(config: TrainConfig) -> type[Algorithm]:
    """The algorithm of a run's config."""
    return type(config).algorithm()


def model_for(config: TrainConfig) -> nn.Module:
    """The network a run trains, as its algorithm builds it (`Algorithm.model`): the master, the
    workers, the learner and evaluation all build it here, so they agree on every name and
    shape."""
    return algorithm_class(config).model(config)


def learns_from_experience(config: TrainConfig) -> bool:
    """Whether the run's workers push experience to a learner beside the master."""
    from a3c_http.algos.base import Sends

    return algorithm_class(config).sends is Sends.EXPERIENCE


def algorithm_for(config: TrainConfig, model: nn.Module, policy: Any) -> Algorithm:
    """A worker's algorithm object for its run."""
    return algorithm_class(config)(config, model, policy)


def _error(kind: str, loc: tuple[Any, ...], value: Any, message: str) -> ValidationError:
    detail = InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=value)
    return ValidationError.from_exception_data("TrainConfig", [detail])


def _with_owners(exc: ValidationError, algo: str) -> ValidationError:
    """`exc` with each unknown field that another algorithm's section has said to be that one's:
    `n_epochs is a field of algo 'ppo' or 'impala', not of 'a3c'`."""
    by_field = owners()
    errors = exc.errors()

    def foreign(error: Any) -> bool:
        loc = error["loc"]
        return error["type"] == "extra_forbidden" and len(loc) == 1 and str(loc[0]) in by_field

    if not any(foreign(e) for e in errors):
        return exc
    line_errors: list[Any] = []
    for e in errors:
        if foreign(e):
            name = str(e["loc"][0])
            them = " or ".join(repr(a) for a in by_field[name])
            message = f"{name!r} is a field of algo {them}, not of {algo!r}"
            e = InitErrorDetails(
                type=PydanticCustomError("extra_forbidden", message), loc=e["loc"], input=e["input"]
            )
        line_errors.append(e)
    return ValidationError.from_exception_data(exc.title, line_errors)


def _section(value: Any) -> Any:
    return value if isinstance(value, TrainConfig) else read_config(value)[0]


# A config of any algorithm as a field of another model (the worker's POST /start): read as
# `read_config` reads it, its errors under the field's name.
AnyTrainConfig = Annotated[
    TrainConfig,
    BeforeValidator(_section),
    WithJsonSchema({"anyOf": section_schemas()}),
]
