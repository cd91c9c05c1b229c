"""Result paths: stored relative to the results dir; rows of older versions still resolve."""

from __future__ import annotations

from pathlib import Path

from dispatcher.tasks.resultpaths import real_path, real_result, stored_result

TASK = "3f2a9c1e" * 4


def _result(path: str) -> dict[str, object]:
    return {"text": None, "files": [{"path": path, "name": "out.mp4", "size": 3}]}


def test_a_stored_path_is_relative_and_resolves_under_a_new_root(tmp_path: Path) -> None:
    old, new = tmp_path / "old" / "results", tmp_path / "new" / "results"
    stored = stored_result(_result(str(old / TASK / "attempt-1" / "out.mp4")), old)
    assert stored["files"][0]["path"] == f"{TASK}/attempt-1/out.mp4"
    real = real_result(stored, new, TASK)
    assert real["files"][0]["path"] == str(new / TASK / "attempt-1" / "out.mp4")


def test_an_absolute_path_of_an_older_row_is_re_rooted_when_moved(tmp_path: Path) -> None:
    old, new = tmp_path / "old" / "results", tmp_path / "new" / "results"
    moved = new / TASK / "attempt-2" / "out.mp4"
    moved.parent.mkdir(parents=True)
    moved.write_bytes(b"abc")
    assert real_path(str(old / TASK / "attempt-2" / "out.mp4"), new, TASK) == moved
    # Where the file still is, an absolute path is taken as it is.
    here = tmp_path / "elsewhere" / TASK / "x.png"
    here.parent.mkdir(parents=True)
    here.write_bytes(b"x")
    assert real_path(str(here), new, TASK) == here


def test_a_stored_path_never_leaves_the_results_dir(tmp_path: Path) -> None:
    root = tmp_path / "results"
    assert real_path("../../etc/passwd", root, TASK) == root / "etc" / "passwd"
    # A file outside the results dir (none is made so today) is kept absolute.
    outside = str(tmp_path / "cache" / "a.png")
    assert stored_result(_result(outside), root)["files"][0]["path"] == outside
