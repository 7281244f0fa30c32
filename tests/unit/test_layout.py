"""The code keeps to the folders' table of docs/design.md: each folder imports only what its row
names, the library imports neither service, the services never import each other, and no folder
holds more than 15 modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("a3c_http", "master", "worker")
TOP_MODULES = {"a3c_http": {"tuning"}, "master": {"app", "state", "errors"}}


def folder_of(module: str) -> str | None:
    """The table's name for where a dotted module lives: `a3c_http/config`, `a3c_http/tuning`,
    `master/state`, `worker`, ... (None: not ours)."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    if parts[0] == "worker" or len(parts) == 1:
        return parts[0]
    return f"{parts[0]}/{parts[1]}"


def modules() -> list[tuple[str, Path]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found.append((dotted.removesuffix(".__init__"), path))
    return found


def imports_of(path: Path) -> set[str]:
    """Every module of ours that `path` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from a3c_http import tuning` imports a3c_http.tuning, not a3c_http itself
            subs = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= {s for s in subs if folder_of(s) != folder_of(node.module)} or {node.module}
    return {name for name in found if folder_of(name) is not None}


def every_folder() -> set[str]:
    names = {folder_of(module) for module, _ in modules()}
    return {name for name in names if name not in PACKAGES or name == "worker"}


def allowed(cell: str, row_package: str) -> set[str] | None:
    """The folders a row's 'may import' cell names; None: anything."""
    text = cell.strip()
    if text in ("", "anything"):
        return None
    if text == "nothing of ours":
        return set()
    everything = every_folder()
    out: set[str] = set()
    for group in text.split(";"):
        group = group.strip()
        match = re.match(r"any (?:folder )?of `(\w+)`(?: but (.*))?$", group)
        if match:
            package, but = match.groups()
            excluded = {f"{package}/{n}" for n in re.findall(r"`(\w+)`", but or "")}
            out |= {f for f in everything if f.startswith(f"{package}/")} - excluded
            continue
        package = row_package
        owner = re.match(r"`(\w+)`'s (.*)$", group)
        if owner:
            package, group = owner.groups()
        for name in re.findall(r"`([\w/.]+)`", group):
            out.add(name.removesuffix(".py") if "/" in name else f"{package}/{name}")
    return out


def table() -> dict[str, set[str] | None]:
    """docs/design.md's folders table: folder -> the folders it may import."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## The folders and what they may import", 1)[1]
    rules: dict[str, set[str] | None] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`([\w/.]+)`", cells[0]):
            name = name.rstrip("/").removesuffix(".py")
            if name.split("/")[0] in PACKAGES:
                rules[name] = allowed(cells[2], name.split("/")[0])
    return rules


def test_every_folder_has_a_row_and_keeps_to_it() -> None:
    rules = table()
    assert set(rules) >= every_folder(), f"no row for {sorted(every_folder() - set(rules))}"
    broken = []
    for module, path in modules():
        source = folder_of(module)
        rule = rules.get(source)
        if rule is None:
            continue
        for imported in imports_of(path):
            target = folder_of(imported)
            if target not in (source, "a3c_http", "master") and target not in rule:
                broken.append(f"{path.relative_to(ROOT)} imports {imported} ({target})")
    assert not broken, "imports the folders table does not allow:\n" + "\n".join(broken)


def test_the_library_and_the_services_keep_apart() -> None:
    for module, path in modules():
        package = module.split(".")[0]
        others = {folder_of(m).split("/")[0] for m in imports_of(path)} - {package}
        if package == "a3c_http":
            assert not others, f"{module} imports a service: {others}"
        else:
            assert others <= {"a3c_http"}, f"{module} imports another service: {others}"
        if not module.startswith("a3c_http.testing"):
            assert not any(m.startswith("a3c_http.testing") for m in imports_of(path)), module
        if not module.startswith(("a3c_http.local", "a3c_http.cli", "a3c_http.api")):
            assert not any(m.startswith("a3c_http.local") for m in imports_of(path)), module


def test_no_folder_holds_more_than_15_modules() -> None:
    for package in PACKAGES:
        for folder in [ROOT / package, *(p for p in (ROOT / package).iterdir() if p.is_dir())]:
            count = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
            assert count <= 15, f"{folder.relative_to(ROOT)} holds {count} modules"
