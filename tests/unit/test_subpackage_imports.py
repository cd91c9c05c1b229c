"""The layout's import rules: each subpackage of `dispatcher` imports only what
its `__init__` docstring says it may (a change that crosses a line shows here
first, as a design question, not later as a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dispatcher"

# The subpackages each one may import, besides the shared top-level modules
# (errors, clock, models, profiles, events, ...). Kept beside the docstrings.
MAY_IMPORT: dict[str, set[str]] = {
    "store": set(),
    "tasks": {"store", "scheduling", "hosts", "http"},
    "scheduling": {"store", "tasks", "accounts"},
    "accounts": {"store", "tasks", "scheduling"},
    "hosts": {"store", "tasks", "scheduling"},
    "notify": {"store", "tasks"},
    "http": {"store", "tasks", "scheduling", "accounts", "hosts", "service", "notify"},
    "service": {"store", "tasks", "scheduling", "accounts", "hosts", "notify", "http"},
    "cli": {"store", "tasks", "scheduling", "accounts", "hosts", "notify", "http", "service"},
}


def subpackages() -> list[str]:
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def imported_subpackages(module: Path) -> set[str]:
    """The `dispatcher` subpackages a module imports, lazily or not."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "dispatcher":
                names = [f"dispatcher.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "dispatcher" and len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
                found.add(parts[1])
    return found


def test_every_subpackage_has_rules_and_a_docstring_saying_what_it_owns() -> None:
    for name in subpackages():
        assert name in MAY_IMPORT, f"dispatcher/{name}/ has no import rule here"
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        owns = f"dispatcher/{name}/__init__.py: say what it owns and may import"
        assert doc and "May import:" in doc, owns


@pytest.mark.parametrize("name", sorted(MAY_IMPORT))
def test_a_subpackage_imports_only_what_it_may(name: str) -> None:
    crossing = {
        f"{module.relative_to(PACKAGE.parent)} imports dispatcher.{other}"
        for module in (PACKAGE / name).rglob("*.py")
        for other in imported_subpackages(module) - MAY_IMPORT[name] - {name}
    }
    assert not crossing, sorted(crossing)


def test_the_rule_itself_catches_a_crossing(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from dispatcher.service.core import Service\n")
    assert imported_subpackages(module) == {"service"}
