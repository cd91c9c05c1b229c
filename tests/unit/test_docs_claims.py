"""What the README and docs promise about the bundled files matches the files."""

from __future__ import annotations

import re

from tests.support.helpers import REPO


def _task_lines(name: str) -> int:
    lines = (REPO / "demo" / name).read_text().splitlines()
    return sum(1 for line in lines if line.strip() and not line.lstrip().startswith("#"))


def test_the_readme_counts_the_sample_batch_as_it_is() -> None:
    readme = (REPO / "README.md").read_text()
    claim = re.search(
        r"batch demo/sample-batch\.jsonl.*\"(\d+) success of (\d+), (\d+) from cache\"", readme
    )
    assert claim, "the README no longer shows the sample batch's summary"
    tasks = _task_lines("sample-batch.jsonl")
    assert {int(n) for n in claim.groups()} == {tasks}, (claim.group(0), tasks)


def test_no_doc_says_an_invalid_profile_stops_the_start() -> None:
    # An invalid profile is logged and its model refuses tasks; the service starts.
    for doc in ("docs/profiles.md", "docs/comfyui.md"):
        text = " ".join((REPO / doc).read_text().split())
        assert "stops the start" not in text, doc


def _heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings."""
    headings = re.findall(r"^#+ (.*)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_link_between_the_docs_leads_somewhere() -> None:
    docs = [REPO / n for n in ("README.md", "BENCHMARKS.md", "CHANGELOG.md", "RELIABILITY.md")]
    docs += sorted((REPO / "docs").glob("*.md"))
    broken = []
    for doc in docs:
        for link in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = link.partition("#")
            target = (doc.parent / path) if path else doc
            if not target.exists():
                broken.append(f"{doc.name}: {link} (no such file)")
                continue
            is_doc = anchor and target.suffix == ".md"
            if is_doc and anchor not in _heading_anchors(target.read_text(encoding="utf-8")):
                broken.append(f"{doc.name}: {link} (no such heading)")
    assert not broken, broken


def test_the_newcomers_docs_stay_short_enough_to_read() -> None:
    # README and BENCHMARKS are read end to end by a newcomer (issue 32):
    # detail belongs in docs/, dated run logs in git's history.
    budgets = {"README.md": 150, "BENCHMARKS.md": 200}
    for name, most in budgets.items():
        lines = len((REPO / name).read_text(encoding="utf-8").splitlines())
        assert lines <= most, f"{name} has {lines} lines; at most {most}: move detail to docs/"


def test_the_readme_shows_the_two_commands_and_the_task_path() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for command in ("demo", "test"):
        assert f"make {command}" in readme
        assert re.search(rf"^{command}:", makefile, re.MULTILINE), command
    (path,) = re.findall(r"## How a task flows\n\n```\n(.*?)```", readme, re.DOTALL)
    steps = [line.split()[0] for line in path.splitlines()]
    assert steps == ["intake", "queue", "lane", "runner", "result"], steps
