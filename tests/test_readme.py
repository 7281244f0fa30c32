"""The README's configuration reference and endpoint table stay true to the code."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from a3c_http.config.training import TrainConfig
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
    from a3c_http.config.settings import Settings

    master = create_master(Settings(run_dir=tmp_path / "run"))
    worker = create_worker(token=None)
    for app in (master, worker):
        for route in app.routes:
            path = getattr(route, "path", "")
            if path.startswith(("/openapi", "/docs", "/redoc")):
                continue
            assert f"{path}`" in README or f"{path}?" in README, f"README lacks {path}"


def test_the_package_pins_no_exact_torch_and_the_venv_does() -> None:
    """pyproject.toml states what the code needs (a range); scripts/constraints.txt pins the
    exact torch of this project's machines, as the README says."""
    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    requirements = {Requirement(r).name: Requirement(r) for r in project["dependencies"]}
    torch = requirements["torch"]
    assert not any(spec.operator in ("==", "===") for spec in torch.specifier), torch
    assert torch.specifier.contains("2.13.0")
    gymnasium = requirements["gymnasium"]
    # gymnasium.vector.AutoresetMode, which rollout.py uses, appeared in 1.1.
    assert not gymnasium.specifier.contains("1.0.0") and gymnasium.specifier.contains("1.1.0")
    assert not gymnasium.specifier.contains("2.0.0")
    assert "pydantic-settings" in requirements
    constraints = (root / "scripts" / "constraints.txt").read_text().split()
    assert "torch==2.13.0" in constraints
    assert "PyTorch 2.13.0" in README and "scripts/constraints.txt" in README
