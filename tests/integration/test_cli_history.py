"""After the run, from the CLI: jobs, tasks, results, prefixes, exit codes, JSON errors.

The CLI and the service are real processes (`tests/support/servicecli.py`), as an
operator would run them.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servicecli import ServiceProcess, clean_env, run_cli, start_service

pytestmark = pytest.mark.timeout(300)

BATCH = [
    {"model": "demo-chat-api", "ref": "tagline", "prompt": "a tagline", "gen_s": 1},
    {"model": "demo-video", "ref": "clip", "prompt": "a clip", "gen_s": 2},
    {"model": "demo-queue", "ref": "poster", "prompt": "a poster", "image_size": "square"},
    {"model": "demo-chat-api", "ref": "refused", "prompt": "no [status=400]"},
]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    proc = start_service(tmp_path_factory.mktemp("history"))
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()[-3000:]


@pytest.fixture(scope="module")
def finished_job(service: ServiceProcess, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The id of a finished job: three results with refs, one refused task."""
    path = tmp_path_factory.mktemp("batch") / "story.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in BATCH))
    run = service.cli("batch", str(path), "--name", "story", "--json")
    assert run.returncode == 1, run.stderr  # one task failed
    job = json.loads(run.stdout)
    assert job["counts"] == {"pending": 0, "running": 0, "success": 3, "failed": 1, "canceled": 0}
    return str(job["id"])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_jobs_and_tasks_list_newest_first(service: ServiceProcess, finished_job: str) -> None:
    single = service.cli("submit", "demo-chat-api", "a single task", "--ref", "solo", "--wait")
    assert single.returncode == 0, single.stderr
    jobs, jobs_json, tasks, failed, limited = service.cli_many(
        ("jobs",),
        ("jobs", "--state", "partial", "--json"),
        ("tasks", "--job", finished_job[:6]),
        ("tasks", "--state", "failed", "--json"),
        ("tasks", "--limit", "1"),
    )
    assert jobs.returncode == 0, jobs.stderr
    row = next(line for line in jobs.stdout.splitlines() if finished_job[:8] in line)
    assert "story" in row and "partial" in row and "4/4" in row
    page = json.loads(jobs_json.stdout)
    assert [j["id"] for j in page["items"]] == [finished_job] and page["next"] is None
    # A finished job's time is its own, from creation to its last task's end
    # (not the time until this listing, which keeps growing).
    (item,) = page["items"]
    assert item["finished_at"] is not None
    assert item["elapsed_s"] == pytest.approx(item["finished_at"] - item["created_at"])
    assert item["elapsed_s"] > 0

    assert tasks.returncode == 0, tasks.stderr
    lines = [line for line in tasks.stdout.splitlines() if finished_job[:8] in line]
    # Newest first: the batch's lines in reverse, each with its ref.
    assert [
        next(ref for ref in ("refused", "poster", "clip", "tagline") if ref in line)
        for line in lines
    ] == ["refused", "poster", "clip", "tagline"]
    assert "solo" not in tasks.stdout

    (refused,) = json.loads(failed.stdout)["items"]
    assert refused["ref"] == "refused" and refused["error"]["kind"] == "http_400"
    assert "solo" in limited.stdout and "more tasks follow" in limited.stdout
    cursor = limited.stdout.split("--after")[-1].split()[0]
    following = service.cli("tasks", "--limit", "1", "--after", cursor)
    assert "refused" in following.stdout and "solo" not in following.stdout


def test_results_are_collected_into_a_folder_named_by_ref(
    service: ServiceProcess, finished_job: str, tmp_path: Path
) -> None:
    out = tmp_path / "collected"
    first = service.cli("results", finished_job[:8], "--out", str(out))
    assert first.returncode == 1, first.stderr  # one task of the job did not succeed
    assert "refused" in first.stderr and "http_400" in first.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "clip.mp4",
        "manifest.csv",
        "poster.png",
        "tagline.txt",
    ]
    assert (out / "tagline.txt").read_text().strip().endswith("a tagline")
    assert (out / "poster.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    with (out / "manifest.csv").open() as handle:
        rows = {row["ref"]: row for row in csv.DictReader(handle)}
    assert list(rows) == ["tagline", "clip", "poster", "refused"]
    for ref, name in (("tagline", "tagline.txt"), ("clip", "clip.mp4"), ("poster", "poster.png")):
        assert rows[ref]["state"] == "success" and rows[ref]["files"] == name
        assert rows[ref]["sha256"] == _sha256(out / name) and rows[ref]["error"] == ""
    assert rows["refused"]["state"] == "failed" and rows["refused"]["files"] == ""
    assert rows["refused"]["error"].startswith("http_400:") and rows["refused"]["attempt"] == "1"
    assert rows["clip"]["model"] == "demo-video" and len(rows["clip"]["task_id"]) == 32

    # Again: the same bytes are left alone; a changed file is refused unless --overwrite.
    again = service.cli("results", finished_job, "--out", str(out), "--json")
    summary = json.loads(again.stdout)
    assert (summary["written"], summary["unchanged"], summary["complete"]) == (0, 3, False)
    (out / "clip.mp4").write_bytes(b"edited by hand")
    refused = service.cli("results", finished_job, "--out", str(out))
    assert refused.returncode == 2 and "clip.mp4" in refused.stderr
    assert (out / "clip.mp4").read_bytes() == b"edited by hand"
    replaced = service.cli("results", finished_job, "--out", str(out), "--overwrite")
    assert replaced.returncode == 1, replaced.stderr
    assert _sha256(out / "clip.mp4") == rows["clip"]["sha256"]


def test_status_takes_a_prefix_and_says_where_the_result_is(
    service: ServiceProcess, finished_job: str
) -> None:
    with service.http() as client:
        tasks = client.get(f"/v1/jobs/{finished_job}").json()["tasks"]
    clip = next(t for t in tasks if t["ref"] == "clip")
    shown = service.cli("status", clip["id"][:8])
    assert shown.returncode == 0, shown.stderr
    path = clip["result"]["files"][0]["path"]
    assert path in shown.stdout.replace("\n", "") and Path(path).is_file()
    assert "clip" in shown.stdout and "attempts" in shown.stdout
    # Which host made it (with several hosts, where its files are).
    assert clip["host"] and f"host     │ {clip['host']}" in shown.stdout
    job = service.cli("status", finished_job[:4], "--json")
    assert json.loads(job.stdout)["id"] == finished_job


def test_status_lists_what_a_failed_attempt_left(
    service: ServiceProcess, finished_job: str
) -> None:
    with service.http() as client:
        tasks = client.get(f"/v1/jobs/{finished_job}").json()["tasks"]
    refused = next(t for t in tasks if t["ref"] == "refused")
    shown = service.cli("status", refused["id"])
    assert shown.returncode == 0, shown.stderr
    where = f"/v1/tasks/{refused['id']}/artifacts/1/<name>"
    assert f"attempt 1: answer.txt ({where})" in shown.stdout.replace("\n", "")


def test_bad_input_exits_2_and_json_mode_always_prints_an_object(
    service: ServiceProcess, tmp_path: Path
) -> None:
    runs = service.cli_many(
        ("submit", "no-such-model", "x"),
        ("submit", "no-such-model", "x", "--json"),
        ("status", "ffffffffffff"),
        ("status", "ffffffffffff", "--json"),
        ("tasks", "--state", "bogus", "--json"),
        ("results", "--json"),
        ("jobs", "--no-such-option", "--json"),
        ("submit", "demo-chat-api", "x", "--ref", "has space", "--json"),
    )
    assert [r.returncode for r in runs] == [2] * len(runs), [r.stderr for r in runs]
    assert "unknown model 'no-such-model'" in runs[0].stderr
    for run in [*runs[1::2], runs[4], runs[6]]:  # every --json run
        error = json.loads(run.stdout)["error"]
        assert error["kind"] and error["message"], run.stdout
    assert json.loads(runs[3].stdout)["error"]["kind"] == "not_found"
    assert json.loads(runs[5].stdout)["error"]["kind"] == "usage"

    nobody = run_cli(
        ["jobs", "--json"], clean_env({"DISPATCHER_STATE_DIR": str(tmp_path / "none")}), tmp_path
    )
    assert nobody.returncode == 3
    assert json.loads(nobody.stdout)["error"]["kind"] == "unavailable"


def test_a_repeat_says_it_came_from_the_cache_and_force_runs_it_anew(
    service: ServiceProcess, tmp_path: Path
) -> None:
    path = tmp_path / "repeat.csv"
    path.write_text(
        "ref,model,prompt,gen_s\nr1,demo-chat-api,repeat one,1\nr2,demo-chat-api,repeat two,1\n"
    )
    first, again, forced = (
        service.cli("batch", str(path)),
        service.cli("batch", str(path)),
        service.cli("batch", str(path), "--force", "--json"),
    )
    assert first.returncode == 0 and "from cache" not in first.stdout, first.stdout
    assert again.returncode == 0 and "2 success of 2, 2 from cache" in again.stdout, again.stdout
    job = json.loads(forced.stdout)
    assert job["from_cache"] == 0 and all(t["force"] for t in job["tasks"])
    assert [t["ref"] for t in job["tasks"]] == ["r1", "r2"]


def test_lists_read_at_80_columns_with_whole_short_ids(
    service: ServiceProcess, finished_job: str
) -> None:
    narrow = {**service.env, "COLUMNS": "80"}
    ids = json.loads(service.cli("tasks", "--job", finished_job, "--json").stdout)["items"]
    jobs = run_cli(["jobs"], narrow, service.cwd)
    tasks = run_cli(["tasks", "--job", finished_job[:8]], narrow, service.cwd)
    status = run_cli(["status", finished_job], narrow, service.cwd)
    for run in (jobs, tasks, status):
        assert run.returncode == 0, run.stderr
        assert max(len(line) for line in run.stdout.splitlines()) <= 80, run.stdout
    # Before: ten columns squeezed into 80, ids cut to "fdfa…".
    assert finished_job[:8] in jobs.stdout
    for task in ids:
        row = next(line for line in tasks.stdout.splitlines() if task["id"][:8] in line)
        assert task["state"] in row
    assert "4/4" in status.stdout and "█" not in status.stdout


def test_piped_without_columns_every_row_is_one_line_grep_can_find(
    service: ServiceProcess, finished_job: str
) -> None:
    # As `dispatcher tasks | grep ...` runs it: stdout a pipe, no COLUMNS.
    piped = {k: v for k, v in service.env.items() if k != "COLUMNS"}
    items = json.loads(service.cli("tasks", "--job", finished_job, "--json").stdout)["items"]
    tasks = run_cli(["tasks", "--job", finished_job[:8]], piped, service.cwd)
    lanes = run_cli(["lanes"], piped, service.cwd)
    assert tasks.returncode == 0 and lanes.returncode == 0, tasks.stderr + lanes.stderr
    # Before: wrapped at 80 columns, a result's name split over three lines.
    for task in items:
        (row,) = [line for line in tasks.stdout.splitlines() if task["id"][:8] in line]
        assert task["model"] in row and task["state"] in row, tasks.stdout
        for file in (task.get("result") or {}).get("files") or []:
            assert f"{file['name'] or file['path']} ({file['size']} bytes)" in row, tasks.stdout
    lane_rows = [line for line in lanes.stdout.splitlines() if "api:demo " in line]
    assert len(lane_rows) == 1 and "demo-chat-api, demo-video" in lane_rows[0], lanes.stdout
