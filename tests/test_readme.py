"""The README's configuration reference and endpoint table stay true to the code."""

from __future__ import annotations

import re
from pathlib import Path

from a3c_http.config import TrainConfig
from master.app import create_app as create_master
from worker.app import create_app as create_worker

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
CODE_DIRS = ("a3c_http", "master", "worker")


def test_every_training_config_field_is_documented() -> None:
    for name in TrainConfig.model_fields:
        assert f"| `{name}` |" in README, f"README lacks a row for the config field {name}"


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    root = Path(__file__).resolve().parent.parent
    names = set()
    for folder in CODE_DIRS:
        for path in (root / folder).rglob("*.py"):
            names |= set(re.findall(r"\"(A3C_[A-Z_]+)\"", path.read_text()))
    assert names, "no A3C_ variable found: the pattern is out of date"
    for name in sorted(names):
        assert f"| `{name}` |" in README, f"README lacks a row for {name}"


def test_every_route_is_in_the_endpoint_tables(tmp_path: Path) -> None:
    from a3c_http.config import Settings

    master = create_master(Settings(run_dir=tmp_path / "run"))
    worker = create_worker(token=None)
    for app in (master, worker):
        for route in app.routes:
            path = getattr(route, "path", "")
            if path.startswith(("/openapi", "/docs", "/redoc")):
                continue
            assert f"{path}`" in README or f"{path}?" in README, f"README lacks {path}"
