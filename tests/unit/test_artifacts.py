"""Artifacts of failed attempts: names, listing, redaction, retention."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.errors import InputError, NotFound
from dispatcher.logs import redact
from dispatcher.models import Kind, State, Task
from dispatcher.tasks.artifacts import (
    KeptArtifacts,
    Retention,
    artifact_file,
    capped_text,
    keep_answer,
    list_artifacts,
    plan_prune,
    prune,
    save_artifact,
    task_artifacts,
)


def _attempt(results: Path, task: str, n: int) -> Path:
    return results / task / f"attempt-{n}"


def test_listing_reads_the_files_on_disk_per_attempt(tmp_path: Path) -> None:
    save_artifact(_attempt(tmp_path, "t1", 1), "screenshot.png", b"\x89PNG....")
    save_artifact(_attempt(tmp_path, "t1", 1), "page.html", b"<p>hi</p>")
    save_artifact(_attempt(tmp_path, "t1", 2), "answer.txt", b"{}")
    (_attempt(tmp_path, "t1", 2) / "artifacts" / "stray.sh").write_text("echo")
    (_attempt(tmp_path, "t1", 3)).mkdir()  # an attempt without artifacts
    assert list_artifacts(tmp_path, "t1") == {
        "1": [
            {"name": "screenshot.png", "kind": "screenshot", "size": 8},
            {"name": "page.html", "kind": "html", "size": 9},
        ],
        "2": [{"name": "answer.txt", "kind": "answer", "size": 2}],
    }
    assert list_artifacts(tmp_path, "no-such-task") == {}


@pytest.mark.parametrize("state", [State.PENDING, State.RUNNING, State.SUCCESS])
def test_a_first_attempt_the_account_cut_short_lists_its_evidence(
    tmp_path: Path, state: State
) -> None:
    # A logout bounce puts the task back on attempt 1; its page stays there.
    def task(task_id: str) -> Task:
        return Task(
            id=task_id,
            model="demo-chat",
            kind=Kind.WEB,
            queue="web:demo-chat",
            params={},
            fingerprint="f",
            created_at=0.0,
            state=state,
        )

    save_artifact(_attempt(tmp_path, "bounced", 1), "page.html", b"<form id=login>")
    (_attempt(tmp_path, "plain", 1)).mkdir(parents=True)
    assert task_artifacts(tmp_path, task("bounced")) == {
        "1": [{"name": "page.html", "kind": "html", "size": 15}]
    }
    assert task_artifacts(tmp_path, task("plain")) == {}


@pytest.mark.parametrize(
    ("attempt", "name", "error"),
    [
        ("1", "../../../token", InputError),
        ("1", "stray.sh", InputError),
        ("..", "page.html", InputError),
        ("0", "page.html", InputError),
        ("1/../2", "page.html", InputError),
        ("2", "page.html", NotFound),
    ],
)
def test_only_known_names_of_numbered_attempts_are_served(
    tmp_path: Path, attempt: str, name: str, error: type[Exception]
) -> None:
    save_artifact(_attempt(tmp_path, "t1", 1), "page.html", b"<p>hi</p>")
    with pytest.raises(error):
        artifact_file(tmp_path, "t1", attempt, name)
    path, kind = artifact_file(tmp_path, "t1", "1", "page.html")
    assert path.read_bytes() == b"<p>hi</p>" and kind.content_type.startswith("text/plain")


def test_a_vendor_answer_is_redacted_and_capped(tmp_path: Path) -> None:
    redact("sk-live-very-secret-key")
    answer = {"error": "bad key sk-live-very-secret-key", "echo": "Authorization: Bearer abcdefgh"}
    path = keep_answer(_attempt(tmp_path, "t1", 1), answer, Retention(10**9, 100))
    assert path is not None
    text = path.read_text()
    assert "sk-live-very-secret-key" not in text and "abcdefgh" not in text
    assert '"error": "bad key ***"' in text
    big = capped_text("é" * 100_000, 64 * 1024)
    assert len(big) <= 64 * 1024 and big.decode().endswith("kept]\n")
    assert keep_answer(_attempt(tmp_path, "t2", 1), None, Retention(10**9, 100)) is None


def test_retention_drops_the_oldest_attempts_first() -> None:
    kept = [KeptArtifacts(Path(f"a{i}"), mtime=float(i), size=100) for i in range(10)]
    assert plan_prune(kept, Retention(max_bytes=10**9, max_count=3)) == [
        Path(f"a{i}") for i in range(7)
    ]
    assert plan_prune(kept, Retention(max_bytes=450, max_count=100)) == [
        Path(f"a{i}") for i in range(6)
    ]
    # The newest stays even when it alone is over the cap.
    assert plan_prune(kept[:1], Retention(max_bytes=1, max_count=1)) == []


def test_a_crash_loop_cannot_fill_the_disk(tmp_path: Path) -> None:
    policy = Retention(max_bytes=50_000, max_count=5)
    for n in range(1, 41):
        result_dir = _attempt(tmp_path, f"task{n:02d}", 1)
        save_artifact(result_dir, "page.html", b"x" * 4000)
        os.utime(result_dir / "artifacts" / "page.html", (n, n))
        (result_dir / "00-result.png").write_bytes(b"result")  # results are never touched
        prune(tmp_path, policy)
    left = sorted(p.parent.parent.name for p in tmp_path.glob("*/attempt-*/artifacts"))
    assert left == [f"task{n:02d}" for n in range(36, 41)]
    assert len(list(tmp_path.glob("*/attempt-1/00-result.png"))) == 40
