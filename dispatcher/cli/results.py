"""`dispatcher results JOB --out DIR`: a job's results as files in a folder.

Each successful task's media files are written as they are, its text answer
as `.txt`, named from the task's `ref` or else its id; `manifest.csv` lists
every task of the job (including those that did not succeed, with their
errors). A result file already there is left alone when it holds the same
bytes, and refused otherwise unless `--overwrite`: nothing is written then.
The manifest is the index of the latest run and is always rewritten.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.markup import escape

from dispatcher.cli.output import JsonFlag, console, err, error_text, print_json
from dispatcher.cli.plumbing import EXIT_FAILED, EXIT_USAGE, fail, service_client
from dispatcher.cli.progress import job_task_pages
from dispatcher.cli.service_client import ApiError, Client

MANIFEST = "manifest.csv"
MANIFEST_COLUMNS = ("ref", "task_id", "model", "state", "attempt", "files", "sha256", "error")
_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,10}")
MAX_CONFLICTS_SHOWN = 10


@dataclass
class Planned:
    """One file to write: from the service (`file_index`) or a text answer."""

    name: str
    sha256: str
    file_index: int | None = None
    text: str | None = None
    status: str = "new"  # new, unchanged, overwrite


@dataclass
class TaskPlan:
    task: dict[str, Any]
    files: list[Planned] = field(default_factory=list)
    error: str = ""


def _suffix(meta: dict[str, Any]) -> str:
    """The file's own extension (from the service's name for it), when it is a sane one."""
    for candidate in (meta.get("name"), meta.get("path")):
        if candidate:
            suffix = Path(str(candidate)).suffix
            if _SUFFIX.fullmatch(suffix):
                return suffix.lower()
    return ""


def plan(tasks: list[dict[str, Any]]) -> list[TaskPlan]:
    """Which file each result becomes; names are unique within the folder."""
    taken = {MANIFEST}
    plans = []

    def claim(base: str, suffix: str, task_id: str) -> str:
        name = f"{base}{suffix}"
        if name in taken:  # e.g. ref "a-2" next to ref "a" with two files
            name = f"{base}-{task_id[:8]}{suffix}"
        taken.add(name)
        return name

    for task in tasks:
        entry = TaskPlan(task)
        plans.append(entry)
        if task["state"] != "success":
            entry.error = error_text(task) or f"not finished: {task['state']}"
            continue
        base = task.get("ref") or task["id"]
        result = task.get("result") or {}
        files = result.get("files") or []
        for index, meta in enumerate(files):
            numbered = f"{base}-{index + 1}" if len(files) > 1 else base
            entry.files.append(
                Planned(claim(numbered, _suffix(meta), task["id"]), str(meta["sha256"]), index)
            )
        text = result.get("text")
        if text:
            data = str(text).encode()
            entry.files.append(
                Planned(
                    claim(base, ".txt", task["id"]),
                    hashlib.sha256(data).hexdigest(),
                    text=str(text),
                )
            )
    return plans


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 16):
            digest.update(chunk)
    return digest.hexdigest()


def check_existing(plans: list[TaskPlan], out: Path, overwrite: bool) -> list[str]:
    """Mark files already there; the names that differ and may not be overwritten."""
    conflicts = []
    for entry in plans:
        for planned in entry.files:
            target = out / planned.name
            if not target.exists():
                continue
            if target.is_file() and _sha256_of(target) == planned.sha256:
                planned.status = "unchanged"
            elif overwrite and target.is_file():
                planned.status = "overwrite"
            else:
                conflicts.append(planned.name)
    return conflicts


def _fetch(client: Client, entry: TaskPlan, planned: Planned, out: Path) -> None:
    target = out / planned.name
    if planned.text is not None:
        target.write_text(planned.text, encoding="utf-8")
        return
    path = f"/v1/tasks/{quote(entry.task['id'], safe='')}/result?file={planned.file_index}"
    _size, sha256 = client.download(path, target)
    if sha256 != planned.sha256:
        target.unlink(missing_ok=True)
        raise OSError(f"{planned.name}: sha256 {sha256} differs from the recorded {planned.sha256}")


def manifest_rows(plans: list[TaskPlan]) -> list[dict[str, str]]:
    return [
        {
            "ref": entry.task.get("ref") or "",
            "task_id": entry.task["id"],
            "model": entry.task["model"],
            "state": entry.task["state"],
            "attempt": str(entry.task["attempt"]),
            "files": ";".join(p.name for p in entry.files),
            "sha256": ";".join(p.sha256 for p in entry.files),
            "error": entry.error,
        }
        for entry in plans
    ]


def _write_manifest(out: Path, rows: list[dict[str, str]]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=MANIFEST_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    partial = out / f".{MANIFEST}.part"
    partial.write_text(buffer.getvalue(), encoding="utf-8")
    partial.replace(out / MANIFEST)


def results(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="A job id or a unique prefix.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The folder to write into.")],
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace result files that differ.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Collect a job's results into a folder, with manifest.csv.

    Media files as they are, text answers as .txt, named from each task's ref
    (else its id). Exit 1 when some task did not succeed (listed in the
    manifest with its error).
    """
    with service_client(as_json) as client:
        job = client.get(f"/v1/jobs/{quote(job_id, safe='')}")
        # A big job's answer leaves its tasks out: they come in pages.
        found = job.get("tasks")
        if found is None:
            found = job_task_pages(client, job["id"], "", job["total"])
        plans = plan(found)
        try:
            out.mkdir(parents=True, exist_ok=True)
            conflicts = check_existing(plans, out, overwrite)
        except OSError as exc:
            fail(f"cannot use {out}: {exc.strerror or exc}", EXIT_USAGE, "invalid")
        if conflicts:
            shown = ", ".join(conflicts[:MAX_CONFLICTS_SHOWN])
            hidden = len(conflicts) - MAX_CONFLICTS_SHOWN
            more = f" and {hidden} more" if hidden > 0 else ""
            fail(
                f"{len(conflicts)} file(s) in {out} differ from the results: {shown}{more}; "
                "nothing was written (--overwrite replaces them, or pick another --out)",
                EXIT_USAGE,
                "exists",
            )
        counts = {"written": 0, "unchanged": 0}
        for entry in plans:
            for planned in entry.files:
                if planned.status == "unchanged":
                    counts["unchanged"] += 1
                    continue
                try:
                    _fetch(client, entry, planned, out)
                except (OSError, ApiError) as exc:
                    entry.error = f"not collected: {exc}"
                    continue
                counts["written"] += 1
    rows = manifest_rows(plans)
    try:
        _write_manifest(out, rows)
    except OSError as exc:
        fail(f"cannot write {out / MANIFEST}: {exc.strerror or exc}", EXIT_FAILED)
    missing = [entry for entry in plans if entry.error]
    if as_json:
        print_json(
            {
                "job": job["id"],
                "out": str(out),
                **counts,
                "tasks": rows,
                "manifest": str(out / MANIFEST),
                "complete": not missing,
            }
        )
    else:
        console.print(
            f"job {escape(job['name'])} {job['id']}: {counts['written']} file(s) written, "
            f"{counts['unchanged']} unchanged, in {escape(str(out))} "
            f"(index: {escape(str(out / MANIFEST))})"
        )
        for entry in missing:
            name = entry.task.get("ref") or entry.task["id"]
            err.print(f"[red]{escape(name)}[/red] ({entry.task['model']}): {escape(entry.error)}")
    if missing:
        raise typer.Exit(EXIT_FAILED)
