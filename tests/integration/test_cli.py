"""The CLI as a real process against the real service (also a process).

One service for the module, started like an operator would:
`python -m dispatcher --demo` with a state dir, a profiles dir and a fast
time scale; stopped with SIGTERM at the end, which must exit 0.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dispatcher.cli import service_client as cli_client
from dispatcher.service import statedir
from tests.support.servicecli import (
    DEMO_API_KEY,
    ServiceProcess,
    clean_env,
    run_many,
    start_service,
)

pytestmark = pytest.mark.timeout(300)

TASK_ID = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    proc = start_service(tmp_path_factory.mktemp("cli"))
    token = proc.token
    try:
        yield proc
    finally:
        code = proc.stop()
        log = proc.log()
        assert code == 0, log[-3000:]
        assert "dispatcher serving on" in log
        assert token not in log and DEMO_API_KEY not in log


def wait_state(
    service: ServiceProcess, task_id: str, states: set[str], timeout_s: float = 30
) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout_s
    with service.http() as client:
        while True:
            task = client.get(f"/v1/tasks/{task_id}").json()
            if task["state"] in states or time.monotonic() > deadline:
                return dict(task)
            time.sleep(0.05)


def test_the_client_reads_the_files_the_service_writes() -> None:
    assert cli_client.PORT_FILE == statedir.PORT_FILE
    assert cli_client.TOKEN_FILE == statedir.TOKEN_FILE


def test_submit_prints_the_id_and_wait_follows_it_to_the_end(service: ServiceProcess) -> None:
    plain, waited, as_json, refused, bad, unknown = service.cli_many(
        ("submit", "demo-chat-api", "hello from the cli"),
        ("submit", "demo-chat-api", "wait for me", "-p", "gen_s=10", "--wait"),
        ("submit", "demo-video", "a clip", "-p", "gen_s=5", "--wait", "--json"),
        ("submit", "demo-chat-api", "refused [status=400]", "--wait"),
        ("submit", "demo-chat-api", "x", "-p", "no-equals-sign"),
        ("submit", "no-such-model", "x"),
    )
    assert plain.returncode == 0, plain.stderr
    assert TASK_ID.match(plain.stdout.strip()), plain.stdout

    assert waited.returncode == 0, waited.stderr
    task_id = waited.stdout.strip()
    assert TASK_ID.match(task_id)
    assert f"{task_id}: success" in waited.stderr and "wait for me" in waited.stderr

    assert as_json.returncode == 0, as_json.stderr
    task = json.loads(as_json.stdout)
    assert task["state"] == "success" and task["result"]["files"][0]["size"] > 0

    assert refused.returncode == 1
    assert "failed" in refused.stderr and "400" in refused.stderr
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
    assert unknown.returncode == 2 and "unknown model" in unknown.stderr  # bad input


def test_batch_jsonl_with_a_failing_line_exits_1_with_a_summary(
    service: ServiceProcess, tmp_path: Path
) -> None:
    batch = tmp_path / "shots.jsonl"
    batch.write_text(
        "# a comment line\n"
        '{"model": "demo-chat-api", "params": {"prompt": "shot one", "gen_s": 5}}\n'
        '{"model": "demo-chat-api", "prompt": "shot two (flat form)", "gen_s": 5}\n'
        "\n"
        '{"model": "demo-video", "params": {"prompt": "shot three", "gen_s": 10}}\n'
        '{"model": "demo-chat-api", "params": {"prompt": "refused [status=400]"}}\n'
    )
    result = service.cli("batch", str(batch))
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    job_id = re.search(r"job ([0-9a-f]{32}): 4 tasks", out)
    assert job_id, out
    assert "progress 4/4" in out  # live progress lines when not on a terminal
    assert "api:demo" in out  # the per-lane table
    assert "failed tasks" in out and "http_400" in out  # the summary of failures
    assert re.search(r"failed [0-9a-f]{32} demo-chat-api attempt 1/3: http_400", out)
    assert "partial" in out and "3 success, 1 failed of 4" in out

    status, text = service.cli_many(
        ("status", job_id.group(1), "--json"), ("status", job_id.group(1))
    )
    assert status.returncode == 0
    job = json.loads(status.stdout)
    assert job["counts"]["success"] == 3 and job["counts"]["failed"] == 1
    assert text.returncode == 0 and "failed tasks" in text.stdout and "4/4" in text.stdout

    retried = service.cli("retry", job_id.group(1), "--json")
    assert retried.returncode == 0, retried.stderr
    again = json.loads(retried.stdout)
    (redo,) = [t for t in again["tasks"] if "refused" in t["params"]["prompt"]]
    assert redo["attempt"] == 2 and redo["state"] in ("pending", "running", "failed")
    assert all(t["attempt"] == 1 for t in again["tasks"] if t["id"] != redo["id"])


def test_batch_csv_and_json_output(service: ServiceProcess, tmp_path: Path) -> None:
    batch = tmp_path / "assets.csv"
    batch.write_text(
        "model,prompt,gen_s,image_size\n"
        'demo-chat-api,"tagline, with a comma",5,\n'
        "demo-queue,banner,5,landscape_16_9\n"
        "demo-video,clip,5,\n"
    )
    result, as_json = service.cli_many(
        ("batch", str(batch), "--name", "assets"),
        ("batch", str(batch), "--name", "assets again", "--json"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "success — 3 success of 3" in result.stdout
    assert "api:demo-queue" in result.stdout

    assert as_json.returncode == 0, as_json.stderr
    job = json.loads(as_json.stdout)  # nothing but the JSON on stdout
    assert job["name"] == "assets again" and job["state"] == "success"
    prompts = sorted(t["params"]["prompt"] for t in job["tasks"])
    assert prompts == ["banner", "clip", "tagline, with a comma"]
    assert all(t["params"]["gen_s"] == 5 for t in job["tasks"])  # numbers parsed


def test_bad_batch_files_are_refused_with_their_line(
    service: ServiceProcess, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"model": "demo-chat-api", "prompt": "ok"}\n\n{"model": oops}\n')
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(
        '{"model": "demo-chat-api", "prompt": "ok"}\n'
        '{"model": "demo-chat-api", "prompt": "ok too"}\n'
        '{"model": "no-such-model", "prompt": "x"}\n'
    )
    no_model = tmp_path / "no-model.csv"
    no_model.write_text("prompt,gen_s\nhello,1\n")
    results = service.cli_many(
        *(("batch", str(path)) for path in (broken, unknown, no_model, tmp_path / "nope.jsonl"))
    )
    assert all(r.returncode == 2 for r in results), [r.stderr for r in results]
    assert f"{broken}:3: not valid JSON" in results[0].stderr
    assert f"{unknown}:3: unknown model 'no-such-model'" in results[1].stderr
    assert f"{no_model}:1:" in results[2].stderr and "model" in results[2].stderr
    assert "cannot read" in results[3].stderr
    with service.http() as client:  # nothing of the refused files was queued
        jobs = client.get("/v1/jobs").json()["items"]
    assert not any(j["name"] in ("broken", "unknown", "no-model") for j in jobs)


def test_status_cancel_and_retry_a_task_and_cancel_a_job(
    service: ServiceProcess, tmp_path: Path
) -> None:
    batch = tmp_path / "slow.jsonl"
    batch.write_text(
        "".join(
            json.dumps({"model": "demo-queue", "prompt": f"slow poster {i}", "gen_s": 5000}) + "\n"
            for i in range(4)
        )
    )
    long, failed, detached = service.cli_many(
        ("submit", "demo-video", "a very long clip", "-p", "gen_s=5000"),
        ("submit", "demo-chat-api", "refused again [status=400]", "--wait"),
        ("batch", str(batch), "--detach"),
    )
    task_id, failed_id, job_id = (r.stdout.strip() for r in (long, failed, detached))
    assert detached.returncode == 0 and TASK_ID.match(job_id)
    wait_state(service, task_id, {"running"})

    status, canceled, retried, job_cancel, nothing = service.cli_many(
        ("status", task_id),
        ("cancel", task_id),
        ("retry", failed_id),
        ("cancel", job_id, "--json"),
        ("status", "0" * 32),
    )
    assert status.returncode == 0
    # (the cancel runs alongside: the status may already show it)
    assert re.search(r"state\s+│ (running|canceled)", status.stdout), status.stdout
    assert "demo-video" in status.stdout and "api:demo" in status.stdout
    assert canceled.returncode == 0, canceled.stderr
    assert f"task {task_id}" in canceled.stdout
    assert retried.returncode == 0 and "attempt 2/3" in retried.stdout
    assert job_cancel.returncode == 0, job_cancel.stderr
    assert json.loads(job_cancel.stdout)["id"] == job_id
    assert nothing.returncode == 2 and "no task or job" in nothing.stderr

    assert wait_state(service, task_id, {"canceled"})["state"] == "canceled"
    refused = service.cli("retry", task_id)
    assert refused.returncode == 1 and "only failed" in refused.stderr
    deadline = time.monotonic() + 30
    with service.http() as client:
        while client.get(f"/v1/jobs/{job_id}").json()["state"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert client.get(f"/v1/jobs/{job_id}").json()["state"] == "canceled"
    # A job with no failed task has nothing to retry: said, not a silent exit 0.
    job_retry = service.cli("retry", job_id)
    assert job_retry.returncode == 1, job_retry.stdout
    assert "no failed task to retry (4 canceled)" in job_retry.stderr


def test_accounts_switches_and_lanes(service: ServiceProcess, tmp_path: Path) -> None:
    off = service.cli("accounts", "disable", "demo-queue", "--reason", "quota used up")
    assert off.returncode == 0 and "disabled" in off.stdout
    held = tmp_path / "held.jsonl"
    held.write_text('{"model": "demo-queue", "prompt": "waits for its lane", "gen_s": 1}\n')
    watcher = subprocess.Popen(
        [sys.executable, "-m", "dispatcher", "batch", str(held)],
        env=service.env,
        cwd=service.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        listed, lanes_json, lanes_text, accounts_text, no_reason, nobody = service.cli_many(
            ("accounts", "--json"),
            ("lanes", "--json"),
            ("lanes",),
            ("accounts",),
            ("accounts", "disable", "demo-queue"),
            ("accounts", "enable", "nobody"),
        )
        queue = {a["name"]: a for a in json.loads(listed.stdout)}["demo-queue"]
        assert queue["enabled"] is False and queue["reason"] == "quota used up"
        lanes = {lane["name"]: lane for lane in json.loads(lanes_json.stdout)}
        assert lanes["api:demo-queue"]["enabled"] is False
        assert lanes["api:demo"]["concurrency"] == 3 and lanes["api:demo"]["kind"] == "api"
        assert lanes_text.returncode == 0 and "quota used up" in lanes_text.stdout
        assert "quota used up" in accounts_text.stdout
        assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
        assert nobody.returncode == 2 and "no account or provider 'nobody'" in nobody.stderr

        # The batch waits for its lane and says why; enabling it lets it finish.
        with service.http() as client:
            deadline = time.monotonic() + 60
            while not [j for j in client.get("/v1/jobs").json()["items"] if j["name"] == "held"]:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        # The watcher checks closed lanes every 2 s: its line says it saw this
        # one (read as it comes, not after a fixed wait that a busy machine
        # can outrun); the lane is enabled only then.
        assert watcher.stdout is not None
        before = []
        for line in watcher.stdout:  # ends at its exit (the assertion below says why)
            before.append(line)
            if line.startswith("waiting: lane api:demo-queue"):
                break
        on = service.cli("accounts", "enable", "demo-queue", "--json")
        assert on.returncode == 0 and json.loads(on.stdout)["enabled"] is True
        rest, err = watcher.communicate(timeout=60)
        out = "".join(before) + rest
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, out + err
    assert "waiting: lane api:demo-queue is disabled: quota used up" in out
    # The command as this interpreter is called (`python`, `python3`, a venv's path).
    assert " -m dispatcher accounts enable demo-queue" in out


def test_dashboard_prints_a_one_time_url_and_never_the_token(service: ServiceProcess) -> None:
    result = service.cli("dashboard")
    assert result.returncode == 0, result.stderr
    url = result.stdout.strip()
    assert re.fullmatch(rf"{re.escape(service.url)}/v1/session\?code=[\w-]+", url), url
    assert "ssh -N -L" in result.stderr
    assert service.token not in result.stdout + result.stderr
    first = httpx.get(url, follow_redirects=False)
    assert first.status_code == 303 and "dispatcher_session=" in first.headers["set-cookie"]
    assert httpx.get(url, follow_redirects=False).status_code == 403  # once only


def test_clear_messages_when_the_service_is_not_there(
    service: ServiceProcess, tmp_path: Path
) -> None:
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "port").write_text("1\n")  # nothing listens on port 1
    (crashed / "token").write_text("whatever\n")
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "port").write_text((service.state_dir / "port").read_text())
    (stale / "token").write_text("a-token-from-an-earlier-start\n")
    never = clean_env({"DISPATCHER_STATE_DIR": str(tmp_path / "never-started")})
    not_running, dead, refused = run_many(
        [
            ["lanes"],
            ["--state-dir", str(crashed), "submit", "demo-chat-api", "hi"],
            ["--state-dir", str(stale), "status", "x"],
        ],
        never,
        tmp_path,
    )
    assert not_running.returncode == 3
    assert "not running" in not_running.stderr
    # The hint's command runs as printed, from where the operator stands.
    hinted = re.search(r"start it with `([^`]+)`", " ".join(not_running.stderr.split()))
    assert hinted, not_running.stderr
    works = subprocess.run(
        [*hinted.group(1).split(), "--help"], cwd=tmp_path, env=never, capture_output=True
    )
    assert works.returncode == 0, (hinted.group(1), works.stderr)
    assert dead.returncode == 3 and "does not answer" in dead.stderr
    assert refused.returncode == 3
    assert "stale" in refused.stderr and "refused the token" in refused.stderr
    assert service.token not in refused.stderr
