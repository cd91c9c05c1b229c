"""What a failed, stalled or canceled attempt leaves behind, and how much of it we keep.

An attempt's artifacts live beside its results, in
``<state dir>/results/<task id>/attempt-<n>/artifacts/``, under a few fixed
names (so serving one needs no path from the request): a screenshot and the
page's HTML of a web attempt, a Playwright trace when the profile asks for
one, the vendor's last answer of an API attempt. The runners write them
through `save_artifact`; the API lists them (`list_artifacts`) and serves
them (`artifact_file`). Retention is bounded in count and bytes
(`plan_prune`), oldest attempt first, so a crash loop cannot fill the disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher.errors import InputError, NotFound
from dispatcher.logs import scrub
from dispatcher.models import JSON, State, Task

ARTIFACTS_DIR = "artifacts"
# The vendor's last answer is for a person to read: a few pages are enough.
MAX_ANSWER_BYTES = 64 * 1024
# A page's HTML is untrusted and can be huge (inline images, SPA bundles).
MAX_HTML_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class ArtifactKind:
    name: str  # the file name on disk
    kind: str  # what the dashboard calls it
    content_type: str  # how it is served
    download: bool  # served as an attachment rather than shown


# HTML and the vendor's answer are served as plain text: a page we saved must
# never run in the dashboard's origin, whatever it contains.
KINDS: dict[str, ArtifactKind] = {
    k.name: k
    for k in (
        ArtifactKind("screenshot.png", "screenshot", "image/png", False),
        ArtifactKind("page.html", "html", "text/plain; charset=utf-8", False),
        ArtifactKind("trace.zip", "trace", "application/zip", True),
        ArtifactKind("answer.txt", "answer", "text/plain; charset=utf-8", False),
    )
}

_ATTEMPT_DIR = re.compile(r"^attempt-([1-9][0-9]{0,3})$")


def artifacts_dir(result_dir: Path) -> Path:
    """Where an attempt's artifacts go, given its result dir (`RunContext.result_dir`)."""
    return result_dir / ARTIFACTS_DIR


def list_artifacts(results_dir: Path, task_id: str) -> dict[str, list[JSON]]:
    """{"<attempt>": [{"name", "kind", "size"}]} from the files on disk; {} when none."""
    found: dict[int, list[JSON]] = {}
    try:
        attempts = list((results_dir / task_id).iterdir())
    except OSError:
        return {}
    for attempt_dir in attempts:
        match = _ATTEMPT_DIR.match(attempt_dir.name)
        if match is None:
            continue
        items = []
        for kind in KINDS.values():
            try:
                size = (attempt_dir / ARTIFACTS_DIR / kind.name).stat().st_size
            except OSError:
                continue
            items.append({"name": kind.name, "kind": kind.kind, "size": size})
        if items:
            found[int(match.group(1))] = items
    return {str(n): found[n] for n in sorted(found)}


def task_artifacts(results_dir: Path, task: Task) -> dict[str, list[JSON]]:
    """`list_artifacts` for a task answer, one stat for most tasks of a big job.

    An attempt that failed, stalled or was canceled leaves artifacts and then
    either ends the task failed or canceled or starts another attempt. The
    exception is an attempt the account, not the task, cut short (a logout
    bounce): the task goes back on the same attempt and its evidence stays
    under that attempt, whatever the task's state now. So a task on its first
    attempt costs one stat of that attempt's artifacts dir; a job answer
    lists every task.
    """
    if (
        task.attempt == 1
        and task.state not in (State.FAILED, State.CANCELED)
        # os.path on a str: a third of pathlib's cost, on every task of a job.
        and not os.path.isdir(os.path.join(results_dir, task.id, "attempt-1", ARTIFACTS_DIR))
    ):
        return {}
    return list_artifacts(results_dir, task.id)


def artifact_file(
    results_dir: Path, task_id: str, attempt: str, name: str
) -> tuple[Path, ArtifactKind]:
    """The file behind `/v1/tasks/{id}/artifacts/{attempt}/{name}`, checked.

    Only the fixed names exist, so nothing from the request reaches the path
    but a small number; the task id comes from the store.
    """
    kind = KINDS.get(name)
    if kind is None:
        raise InputError(f"artifact name must be one of {', '.join(sorted(KINDS))}")
    if _ATTEMPT_DIR.match(f"attempt-{attempt}") is None:
        raise InputError("attempt must be a whole number from 1")
    path = results_dir / task_id / f"attempt-{attempt}" / ARTIFACTS_DIR / name
    if not path.is_file():
        raise NotFound(f"task {task_id} attempt {attempt} has no {name}")
    return path, kind


# -- writing ---------------------------------------------------------------------


def save_artifact(result_dir: Path, name: str, data: bytes) -> Path:
    """Write one artifact atomically (a reader never sees half a file)."""
    if name not in KINDS:
        raise ValueError(f"unknown artifact {name!r}")
    target = artifacts_dir(result_dir)
    target.mkdir(parents=True, exist_ok=True)
    path = target / name
    partial = target / f".{name}.part"
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    except BaseException:
        # A full disk must not leave half an artifact behind.
        partial.unlink(missing_ok=True)
        raise
    return path


def capped_text(text: str, max_bytes: int) -> bytes:
    """Credentials masked, then cut to `max_bytes` (saying so) on a character boundary."""
    # Masking scans the text several times: bound it first (a vendor's answer
    # may carry megabytes of base64). What is cut here is cut below anyway.
    data = scrub(text[: max_bytes * 2]).encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return data
    note = f"\n\n[cut: {len(text)} characters, the first {max_bytes} bytes kept]\n".encode()
    return data[: max_bytes - len(note)].decode("utf-8", "ignore").encode() + note


def answer_text(answer: Any) -> str:
    """A vendor's answer (decoded JSON or raw text) as text a person can read."""
    if isinstance(answer, str | bytes):
        return answer.decode("utf-8", "replace") if isinstance(answer, bytes) else answer
    try:
        return json.dumps(answer, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(answer)


def save_answer(result_dir: Path, answer: Any) -> Path | None:
    """Keep the vendor's last answer of an attempt, redacted and size-capped."""
    if answer is None:
        return None
    return save_artifact(
        result_dir, "answer.txt", capped_text(answer_text(answer), MAX_ANSWER_BYTES)
    )


# -- retention -------------------------------------------------------------------


@dataclass(frozen=True)
class Retention:
    max_bytes: int
    max_count: int  # attempts that keep artifacts


@dataclass(frozen=True)
class KeptArtifacts:
    path: Path  # an attempt's artifacts dir
    mtime: float
    size: int


def plan_prune(kept: Iterable[KeptArtifacts], policy: Retention) -> list[Path]:
    """Which attempts' artifacts to delete, oldest first, to fit count and bytes.

    The newest attempt always stays, even alone over the byte cap: it is the
    one somebody is about to look at.
    """
    newest_first = sorted(kept, key=lambda k: k.mtime, reverse=True)
    total = 0
    doomed = []
    for index, entry in enumerate(newest_first):
        total += entry.size
        if index > 0 and (index >= policy.max_count or total > policy.max_bytes):
            doomed.append(entry.path)
    return doomed[::-1]


def _scan(results_dir: Path) -> list[KeptArtifacts]:
    kept = []
    for path in results_dir.glob(f"*/attempt-*/{ARTIFACTS_DIR}"):
        size = 0
        mtime = 0.0
        with contextlib.suppress(OSError):
            for item in path.iterdir():
                stat = item.stat()
                size += stat.st_size
                mtime = max(mtime, stat.st_mtime)
        kept.append(KeptArtifacts(path, mtime, size))
    return kept


def prune(results_dir: Path, policy: Retention) -> list[Path]:
    """Delete the oldest attempts' artifacts beyond the policy; blocking (run it in a thread)."""
    doomed = plan_prune(_scan(results_dir), policy)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def keep_answer(result_dir: Path, answer: Any, policy: Retention) -> Path | None:
    """Save an API attempt's last answer, then apply retention; blocking."""
    saved = save_answer(result_dir, answer)
    if saved is not None:
        prune(results_root(result_dir), policy)
    return saved


def results_root(result_dir: Path) -> Path:
    """The results dir an attempt's result dir sits in (`<results>/<task>/attempt-<n>`)."""
    return result_dir.parent.parent
