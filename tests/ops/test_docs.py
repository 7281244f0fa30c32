"""The README and the documentation site (docs/, mkdocs.yml) stay true to the code.

The reference tables of docs/configuration.md and the route table of docs/http-api.md are
generated at build time by docs/hooks/reference.py from the models and the apps themselves, so a
field cannot lack its row; these tests check what the hook cannot: that every A3C_ variable the
code reads is a setting or documented by hand, that every route is described in the prose of the
HTTP API page, that the site builds strictly, and that the README stays a page.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
CODE_DIRS = ("a3c_http", "master", "worker")

sys.path.insert(0, str(DOCS / "hooks"))
import reference  # noqa: E402  (docs/hooks/reference.py, the mkdocs hook)


def test_the_readme_is_a_page() -> None:
    assert len(README.splitlines()) <= 400


def test_the_readmes_links_into_docs_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert links, "the README links into docs/"
    for link in links:
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"


def test_every_training_config_field_is_in_the_generated_reference() -> None:
    from a3c_http.algos.registry import CONFIGS

    table = reference.train_config_table()
    for algo, section in CONFIGS.items():
        for name, field in section.model_fields.items():
            assert field.description, f"{algo}'s {name} has no description"
            assert f"| `{name}` |" in table
    assert "<!-- a3c:train-config -->" in (DOCS / "configuration.md").read_text()


def test_every_setting_is_in_the_generated_reference() -> None:
    from a3c_http.config.settings import Settings, WorkerSettings

    table = reference.settings_table()
    for model in (Settings, WorkerSettings):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            assert f"| `A3C_{name.upper()}` |" in table
    assert "<!-- a3c:settings -->" in (DOCS / "configuration.md").read_text()


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    """A variable the code reads by name (os.environ) is either a field of a settings model,
    whose row the hook generates, or has a row written by hand in docs/configuration.md."""
    names = set()
    for folder in CODE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(re.findall(r"\"(A3C_[A-Z_]+)\"", path.read_text()))
    assert names, "no A3C_ variable found: the pattern is out of date"
    settings = {variable for variable, _, _ in reference.settings_rows()}
    page = (DOCS / "configuration.md").read_text()
    for name in sorted(names - settings):
        assert f"| `{name}` |" in page, f"docs/configuration.md lacks a row for {name}"


def test_every_route_is_in_the_http_api_page() -> None:
    page = (DOCS / "http-api.md").read_text()
    paths = reference.openapi_paths()
    assert "/gradients" in paths["master"] and "/start_worker" in paths["worker"]
    for service, routes in paths.items():
        for path, operations in routes.items():
            for method in operations:
                if method == "head":
                    continue
                assert f"{method.upper()} {path}" in page or (
                    f"{method.upper()} /" in page and f"{path}`" in page
                ), f"docs/http-api.md lacks {method.upper()} {path} ({service})"
    assert "`GET /`" in page  # the dashboard, outside the schema
    assert "<!-- a3c:routes -->" in page


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs not installed")
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    configuration = (tmp_path / "site" / "configuration" / "index.html").read_text()
    assert "a3c:train-config" not in configuration and "max_staleness" in configuration
    assert "A3C_PERSIST_INTERVAL_S" in configuration


def test_the_package_pins_no_exact_torch_and_the_venv_does() -> None:
    """pyproject.toml states what the code needs (a range); scripts/constraints.txt pins the
    exact torch of this project's machines, as the README says."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = {Requirement(r).name: Requirement(r) for r in project["dependencies"]}
    torch = requirements["torch"]
    assert not any(spec.operator in ("==", "===") for spec in torch.specifier), torch
    assert torch.specifier.contains("2.13.0")
    gymnasium = requirements["gymnasium"]
    # gymnasium.vector.AutoresetMode, which rollout.py uses, appeared in 1.1.
    assert not gymnasium.specifier.contains("1.0.0") and gymnasium.specifier.contains("1.1.0")
    assert not gymnasium.specifier.contains("2.0.0")
    assert "pydantic-settings" in requirements
    constraints = (ROOT / "scripts" / "constraints.txt").read_text().split()
    assert "torch==2.13.0" in constraints
    assert "PyTorch 2.13.0" in README and "scripts/constraints.txt" in README
    dev = [Requirement(r).name for r in project["optional-dependencies"]["dev"]]
    assert "mkdocs-material" in dev


def _shell_blocks(text: str) -> list[str]:
    """The `sh` code blocks of a Markdown page (fenced, indented or not)."""
    return re.findall(r"^[ \t]*```(?:sh|bash|console)\n(.*?)^[ \t]*```", text, re.M | re.S)


def test_the_guides_examples_run_the_projects_commands_on_its_ports() -> None:
    """Every command a guide's shell example runs is one pyproject installs, and every local
    address it names is on a port the project uses: the master's, a worker's default, or one of
    workers.txt (a newcomer copies them as they are)."""
    from a3c_http.cli import servers

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    commands = set(pyproject["project"]["scripts"])
    workers = re.findall(r"^[\w.]+:(\d+)", (ROOT / "workers.txt").read_text(), re.M)
    ports = {servers.MASTER_PORT, servers.WORKER_PORT, servers.SHARD_PORT, *map(int, workers)}
    wrong = []
    for page in [ROOT / "README.md", *sorted((DOCS / "guide").glob("*.md"))]:
        for block in _shell_blocks(page.read_text()):
            for line in block.splitlines():  # each command's first word, past VAR=value
                for part in re.split(r"&&|\|\||[;|]", line.split("#", 1)[0]):
                    words = [w for w in part.replace(".venv/bin/", "").split() if "=" not in w]
                    command = words[0] if words else ""  # not an image: a3c-http:0.1.0
                    if re.fullmatch(r"a3c-[a-z-]+", command) and command not in commands:
                        wrong.append(f"{page.name}: command {command}")
            local = r"(?:localhost|127\.0\.0\.1|\[::1\]|0\.0\.0\.0):(\d+)|--port[ =](\d+)"
            for match in re.finditer(local, block):
                port = int(match.group(1) or match.group(2))
                if port not in ports:
                    wrong.append(f"{page.name}: port {port} in {match.group(0)!r}")
    assert not wrong, wrong
    assert len(commands) >= 7 and ports >= {33333, 8001, 8002}


def test_the_pages_hold_the_reference_tables_the_code_makes() -> None:
    """The Markdown read without a build holds the tables the site is built with."""
    for name in reference.PAGES:
        text = (DOCS / name).read_text()
        assert reference.with_tables(text) == text, (
            f"docs/{name}'s tables differ from the code: run .venv/bin/python "
            "docs/hooks/reference.py"
        )
