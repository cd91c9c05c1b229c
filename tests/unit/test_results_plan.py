"""How `dispatcher results` names files: refs first, never two files on one name."""

from __future__ import annotations

from typing import Any

from dispatcher.cli.results import MANIFEST, plan


def _task(
    task_id: str, ref: str | None, result: dict[str, Any] | None, state: str = "success"
) -> dict[str, Any]:
    return {
        "id": task_id,
        "ref": ref,
        "model": "m",
        "state": state,
        "attempt": 1,
        "result": result,
        "error": None,
    }


def _file(name: str, sha: str = "0" * 64) -> dict[str, Any]:
    return {"name": name, "path": f"/state/results/x/{name}", "sha256": sha, "size": 1}


def test_names_come_from_refs_then_ids_and_never_collide() -> None:
    tasks = [
        _task("a" * 32, "shot", {"files": [_file("v.MP4"), _file("poster.png")], "text": None}),
        _task("b" * 32, "shot-1", {"files": [_file("x.mp4")], "text": None}),
        _task("c" * 32, None, {"files": [], "text": "an answer"}),
        _task("d" * 32, "manifest", {"files": [_file("table.csv")], "text": None}),
        _task("e" * 32, "odd", {"files": [_file("no-extension"), _file("evil.sh;rm")]}),
        _task("f" * 32, "broken", None, state="failed"),
    ]
    names = [[p.name for p in entry.files] for entry in plan(tasks)]
    assert names == [
        ["shot-1.mp4", "shot-2.png"],
        ["shot-1-bbbbbbbb.mp4"],  # "shot-1.mp4" was taken by the first task's first file
        ["c" * 32 + ".txt"],
        ["manifest-dddddddd.csv"],  # the manifest's own name is reserved
        ["odd-1", "odd-2"],  # no sane extension: none
        [],
    ]
    assert MANIFEST == "manifest.csv"
    assert plan(tasks)[-1].error == "not finished: failed"
