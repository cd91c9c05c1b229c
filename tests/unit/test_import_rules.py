"""The import rules that keep the design's shape, checked on the source.

- `webrunner` and `apirunner` never import each other: what they share
  (fetch, the allowlist, reference images) lives in `dispatcher`.
- `dispatcher` never imports `demo`, but for its CLI, which hands the demo's
  start-up step to the service (`dispatcher.service.demostartup`).
- `dispatcher` never asks which runner it holds (`isinstance(r, WebRunner)`):
  it calls the `Runner` protocol.

Written in terms of the top-level packages only, so the rules hold however
modules move inside `dispatcher/`. Every import counts: at module level,
inside a function, under `TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dispatcher", "webrunner", "apirunner", "demo")
RUNNER_CLASSES = frozenset({"WebRunner", "ApiRunner"})


@dataclass(frozen=True)
class Breach:
    where: str  # "path:line"
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.lineno, node.module or ""
                continue
            # A relative import, resolved against the importing module's package.
            base = module.split(".")
            drop = node.level - 1 if is_package else node.level
            anchor = base[: len(base) - drop] if drop else base
            yield node.lineno, ".".join([*anchor, *([node.module] if node.module else [])])


def breaches(source: str, module: str, where: str, is_package: bool = False) -> list[Breach]:
    """What the source of `module` does against the rules."""
    tree = ast.parse(source)
    top = module.split(".")[0]
    found: list[Breach] = []
    for line, name in imported(tree, module, is_package):
        target = name.split(".")[0]
        if {top, target} == {"webrunner", "apirunner"}:
            found.append(Breach(f"{where}:{line}", f"{top} imports {name}"))
        in_cli = module == "dispatcher.cli" or module.startswith("dispatcher.cli.")
        if top == "dispatcher" and target == "demo" and not in_cli:
            found.append(Breach(f"{where}:{line}", f"{module} imports {name}"))
    if top == "dispatcher":
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
                and len(node.args) == 2
            ):
                classes = (
                    node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                )
                for cls in classes:
                    name = cls.attr if isinstance(cls, ast.Attribute) else getattr(cls, "id", "")
                    if name in RUNNER_CLASSES:
                        found.append(
                            Breach(f"{where}:{node.lineno}", f"isinstance(..., {name}) in {module}")
                        )
    return found


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_the_tree_keeps_the_import_rules() -> None:
    found = [
        breach
        for path in sources()
        for breach in breaches(
            path.read_text(encoding="utf-8"),
            module_name(path),
            str(path.relative_to(ROOT)),
            is_package=path.name == "__init__.py",
        )
    ]
    assert not found, "import rules broken:\n" + "\n".join(map(str, found))


def test_the_check_reads_every_package() -> None:
    # A check that read nothing would pass: each package has its modules here.
    seen = {module_name(path).split(".")[0] for path in sources()}
    assert seen == set(PACKAGES)


@pytest.mark.parametrize(
    ("module", "source", "what"),
    [
        ("webrunner.page", "from apirunner.refimages import Prepared", "imports apirunner"),
        ("apirunner.attempt", "import webrunner.cookies", "imports webrunner"),
        (
            "webrunner.runner",
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from apirunner.runner import ApiRunner",
            "imports apirunner.runner",
        ),
        ("dispatcher.service", "def f():\n    from demo.bootstrap import Demo", "imports demo"),
        ("dispatcher.tasks.intake", "from ...demo import web_model", "imports demo"),
        ("dispatcher.service", "ok = isinstance(runner, WebRunner)", "isinstance"),
        ("dispatcher.http.login", "isinstance(r, (int, runner.ApiRunner))", "isinstance"),
    ],
)
def test_each_kind_of_breach_is_caught(module: str, source: str, what: str) -> None:
    (found,) = breaches(source, module, "x.py")
    assert what in found.what


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("dispatcher.cli.server", "from demo.bootstrap import Demo"),  # the CLI passes it in
        ("dispatcher.service", "from webrunner.runner import WebRunner"),
        ("webrunner.runner", "from dispatcher.allowlist import Allowlist"),
        ("demo.bootstrap", "from webrunner.runner import WebRunner"),
        ("dispatcher.service", "isinstance(runner, Runner)"),
    ],
)
def test_what_the_rules_allow_passes(module: str, source: str) -> None:
    assert breaches(source, module, "x.py") == []
