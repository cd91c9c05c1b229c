"""What the CLI reads before anything is sent: batch files, session files, profiles.

Real CLI processes against a real service (also a process): a file that is
not a file, one too large, one of too many tasks or with bad lines is
refused with its file:line and exit 2 before the service sees it; the
largest job the docs promise (10,000 tasks) is taken as one; a profile
skipped for an unset variable is named where its model is asked for.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dispatcher.http.limits import MAX_JOB_BODY_BYTES, MAX_JOB_TASKS
from tests.support.helpers import REPO
from tests.support.servicecli import ServiceProcess, clean_env, run_cli, start_service

pytestmark = pytest.mark.timeout(300)

SKIPPED_MODEL = "acme-chat"
SKIPPED_VARIABLE = "ACME_CHAT_URL_UNSET_IN_TESTS"
# An ordinary line of a real batch: about 140 bytes of JSON once sent.
ORDINARY = {"model": "demo-chat-api", "prompt": "a lighthouse at dusk, waves on black rocks"}


def _skipped_profile(directory: Path) -> Path:
    """A valid profile whose base URL comes from a variable nobody sets."""
    directory.mkdir(parents=True, exist_ok=True)
    text = (REPO / "profiles" / "demo-chat-api.toml").read_text()
    text = text.replace('name = "demo-chat-api"', f'name = "{SKIPPED_MODEL}"')
    text = text.replace("${DEMO_API_URL}", "${" + SKIPPED_VARIABLE + "}")
    path = directory / f"{SKIPPED_MODEL}.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    root = tmp_path_factory.mktemp("intake")
    _skipped_profile(root / "profiles")
    proc = start_service(root)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()[-3000:]


def _jobs(service: ServiceProcess) -> list[str]:
    with service.http() as client:
        return [j["name"] for j in client.get("/v1/jobs", params={"limit": 200}).json()["items"]]


def test_inputs_that_are_not_regular_files_are_refused_at_once(
    service: ServiceProcess, tmp_path: Path
) -> None:
    fifo = tmp_path / "tasks.jsonl"
    os.mkfifo(fifo)
    cookies = tmp_path / "cookies.txt"
    os.mkfifo(cookies)
    started = time.monotonic()
    results = service.cli_many(
        ("batch", str(fifo)),
        ("batch", "/dev/zero"),
        ("batch", str(tmp_path)),
        ("accounts", "import", "acct-1", str(cookies)),
        ("accounts", "import", "acct-1", "/dev/zero"),
        timeout_s=60,
    )
    elapsed_s = time.monotonic() - started
    assert [r.returncode for r in results] == [2] * 5, [r.stderr for r in results]
    kinds = ["a FIFO", "a character device", "a directory", "a FIFO", "a character device"]
    for result, kind in zip(results, kinds, strict=True):
        assert f"{kind}, not a regular file" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    assert f"{fifo}: a FIFO" in results[0].stderr
    assert "a session file must be a file" in results[3].stderr
    print(f"five non-regular inputs refused in {elapsed_s:.2f}s")


def test_a_file_past_the_size_cap_stops_there_naming_the_line(
    service: ServiceProcess, tmp_path: Path
) -> None:
    line = json.dumps(ORDINARY) + "\n"
    million = tmp_path / "million.jsonl"
    million.write_text(line * 1_000_000)
    huge_line = tmp_path / "huge-line.jsonl"
    with huge_line.open("w") as handle:
        handle.write(line)
        handle.write('{"model": "demo-chat-api", "prompt": "' + "x" * (50 * 1024 * 1024) + '"}\n')
    cookies = tmp_path / "big-cookies.txt"
    cookies.write_text("# Netscape HTTP Cookie File\n" + "x" * 2_000_000 + "\n")
    started = time.monotonic()
    results = service.cli_many(
        ("batch", str(million)),
        ("batch", str(huge_line)),
        ("accounts", "import", "acct-1", str(cookies)),
        timeout_s=120,
    )
    elapsed_s = time.monotonic() - started
    assert [r.returncode for r in results] == [2, 2, 2], [r.stderr for r in results]
    cap_line = MAX_JOB_BODY_BYTES // len(line) + 1
    assert f"{million}:{cap_line}: the file passes 16 MiB on this line" in results[0].stderr
    assert f"{huge_line}:2: the file passes 16 MiB on this line" in results[1].stderr
    assert f"{cookies}:2: the file passes" in results[2].stderr
    assert "413" not in "".join(r.stderr for r in results)
    assert not {"million", "huge-line"} & set(_jobs(service))
    print(f"1,000,000 lines, a 50 MB line, a 2 MB cookie file: refused in {elapsed_s:.2f}s")


def test_a_batch_of_more_tasks_than_a_job_takes_stops_at_the_first_one_over(
    service: ServiceProcess, tmp_path: Path
) -> None:
    many = tmp_path / "many.jsonl"
    # A comment line first: the task limit counts tasks, not lines.
    many.write_text("# shots\n" + (json.dumps(ORDINARY) + "\n") * 200_000)
    started = time.monotonic()
    result = service.cli("batch", str(many), timeout_s=120)
    elapsed_s = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert f"{many}:{MAX_JOB_TASKS + 2}: task 10,001: a job takes at most 10,000" in result.stderr
    assert "many" not in _jobs(service)
    print(f"200,000 tasks refused at task 10,001 in {elapsed_s:.2f}s")


def test_body_limits_are_stated_in_the_413(service: ServiceProcess) -> None:
    headers = {"Authorization": f"Bearer {service.token}", "Content-Type": "application/json"}
    over_job = b'{"name": "x", "tasks": []}' + b" " * MAX_JOB_BODY_BYTES
    over_task = b'{"model": "demo-chat-api"}' + b" " * (1024 * 1024)
    with httpx.Client(base_url=service.url, headers=headers, timeout=60) as client:
        job = client.post("/v1/jobs", content=over_job)
        task = client.post("/v1/tasks", content=over_task)
    assert job.status_code == 413
    assert "over 16 MiB (16777216 bytes), the most POST /v1/jobs takes" in job.text
    assert task.status_code == 413
    assert "over 1 MiB (1048576 bytes), the most POST /v1/tasks takes" in task.text


def test_every_bad_line_is_reported_in_one_run(service: ServiceProcess, tmp_path: Path) -> None:
    unclosed = tmp_path / "unclosed.csv"
    # Line 2's quote is never closed: before, rows 3-4 became part of its prompt.
    unclosed.write_text(
        'model,prompt\ndemo-chat-api,"a lighthouse\ndemo-chat-api,waves\ndemo-chat-api,rocks\n'
    )
    stray = tmp_path / "stray.csv"
    stray.write_text(
        'model,prompt\ndemo-chat-api,"one\ndemo-chat-api,two\ndemo-chat-api,"three\n'
        "demo-chat-api,four\n"
    )
    several = tmp_path / "several.jsonl"
    several.write_text(
        '{"model": "demo-chat-api", "prompt": "ok"}\n'
        '{"model": "demo-chat-api", "prompt": oops}\n'
        '{"model": "demo-chat-api", "prompt": "ok"}\n'
        '{"model": "demo-chat-api", "prompt": 7}\n'
        '["not", "an", "object"]\n'
    )
    results = service.cli_many(
        ("batch", str(unclosed)), ("batch", str(stray)), ("batch", str(several))
    )
    assert [r.returncode for r in results] == [2, 2, 2], [r.stdout for r in results]
    assert f"{unclosed}:2: a quoted cell that starts in this row is never closed" in (
        results[0].stderr
    )
    assert f"{stray}:2: a quoted cell must end with a quote" in results[1].stderr
    assert "the row runs to line 4" in results[1].stderr
    assert "3 problems in" in results[2].stderr
    assert f"{several}:2: not valid JSON" in results[2].stderr
    assert f"{several}:4.params.prompt must be a string" in results[2].stderr
    assert f"{several}:5: each line must be a JSON object" in results[2].stderr
    assert not {"unclosed", "stray", "several"} & set(_jobs(service))


def test_a_skipped_profile_is_named_when_its_model_is_asked_for(
    service: ServiceProcess, tmp_path: Path
) -> None:
    shots = tmp_path / "acme.jsonl"
    shots.write_text(
        '{"model": "demo-chat-api", "prompt": "ok"}\n{"model": "acme-chat", "prompt": "hi"}\n'
    )
    submit, batch = service.cli_many(("submit", SKIPPED_MODEL, "hi"), ("batch", str(shots)))
    for result in (submit, batch):
        assert result.returncode == 2, result.stderr
        assert f"model {SKIPPED_MODEL!r} is not loaded" in result.stderr
        assert f"{SKIPPED_MODEL}.toml is skipped" in result.stderr
        assert "${" + SKIPPED_VARIABLE + "}" in result.stderr
    assert f"{shots}:2:" in batch.stderr


def test_check_fails_when_no_profile_is_loaded(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    only_skipped = tmp_path / "only-skipped"
    _skipped_profile(only_skipped)
    mixed = tmp_path / "mixed"
    _skipped_profile(mixed)
    shutil.copy(REPO / "profiles" / "demo-chat-api.toml", mixed)
    env = clean_env({"DEMO_API_URL": "http://127.0.0.1:9"})
    nothing = run_cli(["check", str(empty)], env, tmp_path)
    skipped = run_cli(["check", str(only_skipped)], env, tmp_path)
    fine = run_cli(["check", str(mixed)], env, tmp_path)
    assert nothing.returncode == 2, nothing.stdout
    assert f"no profile loaded from {empty}" in nothing.stderr
    assert skipped.returncode == 2, skipped.stdout
    assert f"skipped  {only_skipped / 'acme-chat.toml'}: it needs ${{{SKIPPED_VARIABLE}}}" in (
        skipped.stderr
    )
    assert "no profile loaded" in skipped.stderr and "1 skipped" in skipped.stderr
    assert fine.returncode == 0, fine.stderr
    assert "1 profile(s) valid" in fine.stdout and "1 skipped" in fine.stdout
    assert "skipped  " in fine.stderr


# Last in the module: its 10,000 tasks keep the service busy until it stops.
def test_the_documented_10000_tasks_go_as_one_job(service: ServiceProcess, tmp_path: Path) -> None:
    shots = tmp_path / "ten-thousand.jsonl"
    with shots.open("w") as handle:
        for number in range(MAX_JOB_TASKS):
            task = {**ORDINARY, "ref": f"shot-{number:05d}", "seed": number, "gen_s": 1}
            handle.write(json.dumps(task) + "\n")
    body_bytes = shots.stat().st_size
    assert body_bytes > 1024 * 1024  # past the 1 MiB of every other request
    started = time.monotonic()
    result = service.cli("batch", str(shots), "--detach", timeout_s=240)
    elapsed_s = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    with service.http() as client:
        client.timeout = 120
        job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["total"] == MAX_JOB_TASKS and job["name"] == "ten-thousand"
    print(f"10,000 tasks ({body_bytes / 2**20:.2f} MiB) sent as one job in {elapsed_s:.2f}s")
