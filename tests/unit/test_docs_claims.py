"""What the README and docs promise about the bundled files matches the files."""

from __future__ import annotations

import re

from tests.helpers import REPO


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
