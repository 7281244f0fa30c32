"""A mkdocs hook: the reference tables, generated from the code itself.

A page's markdown holds each table between two markers, each on a line of its own, such as
`<!-- a3c:train-config -->` and `<!-- /a3c:train-config -->`:

- `<!-- a3c:train-config -->`: the training config, its shared section `TrainConfig`
  (a3c_http/config/training.py) and each algorithm's own (a3c_http/algos/<algo>/config.py): one
  row per field, the algorithms that have it, its type, default and `description`;
- `<!-- a3c:settings -->`: the process settings, `Settings` (master) and `WorkerSettings`
  (a3c_http/config/settings.py): one row per `A3C_*` variable, who reads it, its type, default and
  `description` (and one per old name a renamed setting is still read by);
- `<!-- a3c:routes -->`: every route of both services from their OpenAPI schemas, with the status
  codes each can answer.

The site is built with each table made anew (`on_page_markdown`), and the Markdown files keep a
copy, so that they read whole without a build: `python docs/hooks/reference.py` writes it, and
tests/ops/test_docs.py fails while a copy differs from the code. So the reference cannot drift from
the code: a field without a row cannot exist. The functions below are also what the tests call.
"""

from __future__ import annotations

import enum
import json
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

PLACEHOLDERS = {
    "<!-- a3c:train-config -->": "train_config_table",
    "<!-- a3c:settings -->": "settings_table",
    "<!-- a3c:routes -->": "routes_table",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type(annotation: Any) -> str:
    """A type as a reader wants it: `int`, `float or null`, `"none" or "atari"`, `list of int`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is typing.Literal:
        return " or ".join(f'"{a}"' if isinstance(a, str) else json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        return f"list of {_type(inner[0])}" if inner else "list"
    if origin is dict:
        return "object"
    if isinstance(annotation, type):
        if issubclass(annotation, Path):
            return "path"
        if issubclass(annotation, enum.Enum):
            return " or ".join(f'"{m.value}"' for m in annotation)
        return annotation.__name__
    return str(annotation)


def _bounds(field: FieldInfo) -> str:
    parts = []
    for m in field.metadata:
        for kind, attribute, sign in (
            (annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"),
            (annotated_types.Le, "le", "<="), (annotated_types.Lt, "lt", "<"),
        ):
            if isinstance(m, kind):
                parts.append(f"{sign} {getattr(m, attribute)}")
        unit = "characters" if field.annotation in (str, str | None) else "items"
        if isinstance(m, annotated_types.MinLen):
            parts.append(f"at least {m.min_length} {unit}")
        if isinstance(m, annotated_types.MaxLen):
            parts.append(f"at most {m.max_length} {unit}")
    return ", ".join(parts)


def _default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined or value is None:
        return "unset"
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, tuple):
        value = list(value)
    if value == []:
        return "`[]`" if isinstance(field.get_default(call_default_factory=True), list) else "none"
    if isinstance(value, bool | int | float | dict | list):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _type_cell(field: FieldInfo) -> str:
    text = _type(field.annotation)
    bounds = _bounds(field)
    return _cell(f"{text} ({bounds})" if bounds else text)


def train_config_rows() -> list[tuple[str, str, FieldInfo]]:
    """(field, the algorithms whose section has it, field) for every field of any algorithm's
    section (a3c_http/algos/registry.py): the shared fields first (`TrainConfig`, "all"), then
    each section's own in the registry's order; a field two sections define differently (PPO's
    `batch_size` and the value-based one) gets a row each."""
    from a3c_http.algos.registry import CONFIGS
    from a3c_http.config.training import TrainConfig

    rows: list[tuple[str, str, FieldInfo]] = [
        (name, "all", field) for name, field in TrainConfig.model_fields.items()
    ]
    own: dict[str, dict[str, tuple[list[str], FieldInfo]]] = {}
    for algo, section in CONFIGS.items():
        for name, field in section.model_fields.items():
            if name not in TrainConfig.model_fields:
                own.setdefault(name, {}).setdefault(repr(field), ([], field))[0].append(algo)
    for name, kinds in own.items():
        rows.extend((name, ", ".join(algos), field) for algos, field in kinds.values())
    return rows


def train_config_table() -> str:
    rows = [
        "| field | algo | type | default | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    from a3c_http.algos.registry import CONFIGS

    for name, algos, field in train_config_rows():
        if not field.description:
            raise ValueError(f"the training config's {name} ({algos}) has no description")
        kind = "one of " + ", ".join(f"`{a}`" for a in CONFIGS) if name == "algo" else None
        rows.append(
            f"| `{name}` | {algos} | {kind or _type_cell(field)} | {_default(field)} "
            f"| {_cell(field.description)} |"
        )
    return "\n".join(rows)


def settings_rows() -> list[tuple[str, str, FieldInfo]]:
    """(variable, who reads it, field) for every A3C_* setting, in the models' order; a field both
    models share is read by both, one with the same name but another meaning gets a row each. A
    renamed setting's old names, still read, follow its row, each with a row of its own."""
    from a3c_http.config.settings import Settings, WorkerSettings

    rows = []
    master, worker = Settings.model_fields, WorkerSettings.model_fields

    def same(name: str) -> bool:
        return name in master and name in worker and repr(master[name]) == repr(worker[name])

    for name, field in master.items():
        for variable in Settings.variables(name):
            rows.append((variable, "both" if same(name) else "master", field))
    for name, field in worker.items():
        if not same(name):
            rows.extend((variable, "worker", field) for variable in WorkerSettings.variables(name))
    # the variables both read first, then the master's, then the worker's
    order = {"both": 0, "master": 1, "worker": 2}
    return sorted(rows, key=lambda row: order[row[1]])


def settings_table() -> str:
    rows = ["| variable | read by | type | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for variable, reader, field in settings_rows():
        if not field.description:
            raise ValueError(f"the setting {variable} has no description")
        alias = field.validation_alias
        new = str(alias.choices[0]) if isinstance(alias, AliasChoices) else variable
        if variable != new:  # an old name, still read
            rows.append(
                f"| `{variable}` | {reader} | | | the old name of `{new}`, still read (setting "
                "both to different values stops the service at start) |"
            )
            continue
        rows.append(
            f"| `{variable}` | {reader} | {_type_cell(field)} | {_default(field)} "
            f"| {_cell(field.description)} |"
        )
    return "\n".join(rows)


def openapi_paths() -> dict[str, dict[str, dict[str, Any]]]:
    """{"master" or "worker": {path: {method: operation}}} from the two apps' own schemas."""
    from a3c_http.config.settings import Settings
    from master.app import create_app as create_master
    from worker.app import create_app as create_worker

    with tempfile.TemporaryDirectory() as folder:
        master = create_master(Settings(run_dir=Path(folder) / "run"))
        worker = create_worker(token=None)
        return {"master": master.openapi()["paths"], "worker": worker.openapi()["paths"]}


def routes_table() -> str:
    rows = ["| service | method and path | status codes |", "| --- | --- | --- |"]
    for service, paths in openapi_paths().items():
        for path, operations in paths.items():
            for method, operation in operations.items():
                codes = ", ".join(sorted(operation.get("responses", {})))
                rows.append(f"| {service} | `{method.upper()} {path}` | {codes} |")
    return "\n".join(rows)


PAGES = ("configuration.md", "http-api.md")  # the pages that hold tables, in docs/


def with_tables(markdown: str) -> str:
    """`markdown` with each table between its markers made anew from the code."""
    for start, function in PLACEHOLDERS.items():
        end = start.replace("<!-- a3c:", "<!-- /a3c:")
        if start not in markdown:
            continue
        before, rest = markdown.split(start, 1)
        _, after = rest.split(end, 1) if end in rest else ("", rest)
        markdown = f"{before}{start}\n\n{globals()[function]()}\n\n{end}{after}"
    return markdown


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The page as the site shows it: its tables made anew, without their markers."""
    markdown = with_tables(markdown)
    for start in PLACEHOLDERS:
        end = start.replace("<!-- a3c:", "<!-- /a3c:")
        markdown = markdown.replace(start, "").replace(end, "")
    return markdown


if __name__ == "__main__":  # write the tables into the pages' Markdown
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    for name in PAGES:
        page = Path(__file__).resolve().parents[1] / name
        page.write_text(with_tables(page.read_text()))
