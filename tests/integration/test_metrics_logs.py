"""`/metrics` parses and moves as tasks run; the logs of a full run hold no secret."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatcher.logs import MAX_MESSAGE_CHARS, JsonFormatter, RedactingFilter, redact, scrub
from tests.support.harness import running_service
from tests.support.servicecli import DEMO_API_KEY, clean_env, run_cli, start_service

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def total(found: Samples, name: str, **labels: str) -> float:
    """Sum over every label set that includes `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and wanted <= set(ls))


async def scrape(http: httpx.AsyncClient) -> Samples:
    response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


async def test_metrics_parse_and_move_when_tasks_run(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        async with httpx.AsyncClient(base_url=h.service.url) as anon:
            assert (await anon.get("/metrics")).status_code == 401  # the token, as everywhere
        before = await scrape(h.http)
        assert value(before, "dispatcher_lane_running", lane="api:demo") == 0
        assert value(before, "dispatcher_lane_enabled", lane="api:demo-queue") == 1

        job = await h.job(
            "metrics",
            [
                {"model": "demo-chat-api", "params": {"prompt": f"fine {i}", "gen_s": 2}}
                for i in range(3)
            ]
            + [
                {"model": "demo-chat-api", "params": {"prompt": "refused [status=400]"}},
                {
                    "model": "demo-video",
                    "params": {"prompt": "breaks [fail=transient]", "gen_s": 2},
                },
                {"model": "demo-queue", "params": {"prompt": "a poster", "gen_s": 2}},
            ],
        )
        assert (await h.wait_job(job["id"]))["state"] == "partial"
        first = await h.submit("demo-chat-api", "same again", gen_s=1)
        again = await h.submit("demo-chat-api", "same again", gen_s=1)
        assert again["id"] == first["id"] and again["deduped"]
        await h.wait_task(first["id"])
        await asyncio.sleep(0.7)  # past the (scaled) 30 s de-dup window: now the cache answers
        cached = await h.submit("demo-chat-api", "same again", gen_s=1)
        assert cached["from_cache"] and cached["state"] == "success"
        await h.http.post("/v1/accounts/demo-queue/disable", json={"reason": "metrics test"})
        after = await scrape(h.http)

    finished = "dispatcher_tasks_finished_total"
    assert value(after, finished, model="demo-chat-api", state="success") == 5  # 3 + 1 + cached
    assert value(after, finished, model="demo-chat-api", state="failed") == 1
    assert value(after, finished, model="demo-queue", state="success") == 1
    assert value(after, "dispatcher_tasks", model="demo-chat-api", state="success") == 5
    assert value(after, "dispatcher_tasks", model="demo-video", state="failed") == 1
    assert value(after, "dispatcher_task_duration_seconds_count", model="demo-chat-api") == 4
    assert value(after, "dispatcher_task_duration_seconds_sum", model="demo-chat-api") > 0
    stage_count = "dispatcher_stage_duration_seconds_count"
    assert value(after, stage_count, model="demo-queue", stage="dispatched") == 1
    assert value(after, stage_count, model="demo-queue", stage="generating") == 1
    assert total(after, stage_count, model="demo-chat-api") >= 4
    assert value(after, "dispatcher_retries_total") - value(before, "dispatcher_retries_total") == 2
    assert value(after, "dispatcher_dedup_hits_total") == 1
    assert value(after, "dispatcher_cache_hits_total") == 1
    assert value(after, "dispatcher_lane_enabled", lane="api:demo-queue") == 0
    assert ("dispatcher_lane_queued", (("lane", "api:demo"),)) in after
    for counter in (
        "dispatcher_stale_reclaims_total",
        "dispatcher_browser_launches_total",
        "dispatcher_leftover_processes_ended_total",
    ):
        assert (counter, ()) in after
    # Remote requests by provider and HTTP status, counted by the API runner.
    remote = {
        (dict(ls)["provider"], dict(ls)["status"]): n
        for (name, ls), n in after.items()
        if name == "dispatcher_remote_requests_total"
    }
    assert remote.get(("demo", "200"), 0) >= 5
    assert sum(n for (provider, _), n in remote.items() if provider == "demo-queue") > 0


def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = []
    for line in text.splitlines():
        if line.strip():
            lines.append(json.loads(line))  # every line of the JSON format parses
    return lines


def having(lines: Iterable[dict[str, object]], **fields: object) -> list[dict[str, object]]:
    return [line for line in lines if all(line.get(k) == v for k, v in fields.items())]


@pytest.mark.timeout(180)
def test_logs_of_a_full_run_hold_no_secret_and_json_lines_carry_the_task(tmp_path: Path) -> None:
    service = start_service(
        tmp_path,
        args=("--demo", "--log-level", "DEBUG"),
        env={"DISPATCHER_LOG_FORMAT": "json"},
    )
    token = service.token
    try:
        with service.http() as client:
            job = client.post(
                "/v1/jobs",
                json={
                    "name": "secrets",
                    "tasks": [
                        {"model": "demo-chat-api", "params": {"prompt": "fine", "gen_s": 2}},
                        {"model": "demo-video", "params": {"prompt": "clip", "gen_s": 3}},
                        {"model": "demo-queue", "params": {"prompt": "poster", "gen_s": 2}},
                        {"model": "demo-chat-api", "params": {"prompt": "refused [status=400]"}},
                        {
                            "model": "demo-video",
                            "params": {"prompt": "flaky [fail=transient]", "gen_s": 1},
                        },
                    ],
                },
            ).json()
            slow = client.post(
                "/v1/tasks",
                json={"model": "demo-video", "params": {"prompt": "slow", "gen_s": 3000}},
            ).json()
            until(lambda: client.get(f"/v1/tasks/{slow['id']}").json()["state"] == "running")
            client.post(f"/v1/tasks/{slow['id']}/cancel")
            until(lambda: client.get(f"/v1/jobs/{job['id']}").json()["state"] != "running")
            done = client.get(f"/v1/jobs/{job['id']}").json()
            assert done["state"] == "partial", done["counts"]
            # The dashboard's way in, and some refused requests: none of it may be logged.
            code = client.post("/v1/dashboard-code").json()["code"]
            session = httpx.get(f"{service.url}/v1/session?code={code}", follow_redirects=False)
            cookie = session.cookies["dispatcher_session"]
            assert (
                httpx.get(
                    f"{service.url}/v1/lanes", headers={"Cookie": f"dispatcher_session={cookie}"}
                ).status_code
                == 200
            )
            assert (
                httpx.get(
                    f"{service.url}/v1/lanes", headers={"Authorization": "Bearer not-the-token"}
                ).status_code
                == 403
            )
            assert client.get(f"/v1/tasks/{token}").status_code == 404
            client.post("/v1/accounts/demo-queue/disable", json={"reason": "log test"})
    finally:
        code = service.stop()
    log = service.log()
    assert code == 0, log[-3000:]
    assert token not in log
    assert DEMO_API_KEY not in log
    assert cookie not in log

    lines = json_lines(log)
    assert having(lines, message=lines[0]["message"])  # parsed, not empty
    ours = {t["id"] for t in done["tasks"]}
    changes = [line for line in lines if line.get("task_id") in ours and "state" in line]
    # A queued task waits in its model's queue; once claimed, it is on a provider's lane.
    claimed = [line for line in changes if line["state"] != "pending"]
    assert {line["lane"] for line in claimed} == {"api:demo", "api:demo-queue"}
    new = [line for line in changes if line["state"] == "pending" and "from_state" not in line]
    assert new and all(line["lane"].startswith("api-model:") for line in new)
    assert all(isinstance(line["attempt"], int) for line in changes)
    (flaky,) = [t for t in done["tasks"] if "flaky" in t["params"]["prompt"]]
    attempts = {line["attempt"] for line in changes if line["task_id"] == flaky["id"]}
    assert attempts == {1, 2, 3}
    assert having(changes, task_id=flaky["id"], state="failed", attempt=3)
    success = having(changes, state="success", lane="api:demo-queue")
    assert success and success[0]["from_state"] == "running"
    assert having(lines, lane="api:demo-queue", level="info")  # the switch, with its lane
    assert any(line.get("stage") for line in changes)


def test_log_format_flag_is_checked(tmp_path: Path) -> None:
    env = clean_env({"DISPATCHER_STATE_DIR": str(tmp_path / "state")})
    result = run_cli(["--log-format", "xml"], env, tmp_path)
    assert result.returncode == 2 and "--log-format must be one of text, json" in result.stderr
    result = run_cli(["serve"], {**env, "DISPATCHER_LOG_FORMAT": "yaml"}, tmp_path)
    assert result.returncode == 2 and "DISPATCHER_LOG_FORMAT='yaml'" in result.stderr


def test_scrub_masks_registered_secrets_and_credential_shapes() -> None:
    redact("registered-secret-123")
    assert "registered-secret-123" not in scrub("got registered-secret-123 back")
    for line, secret in [
        ("headers: {'Authorization': 'Bearer sk-live-abcdef123456'}", "sk-live-abcdef123456"),
        ("Authorization: Key fal-abcdef123456", "fal-abcdef123456"),
        ("Cookie: dispatcher_session=AbC123xyz789; theme=dark", "AbC123xyz789"),
        ("set-cookie: dispatcher_session=AbC123xyz789; HttpOnly", "AbC123xyz789"),
        ("url=https://x.example/v1?api_key=k-1234567890&x=1", "k-1234567890"),
        ('{"X-Local-Token": "tok-1234567890"}', "tok-1234567890"),
        ("sent dispatcher_session=zz9-secret-value", "zz9-secret-value"),
    ]:
        assert secret not in scrub(line), line
    assert scrub("[api:demo] task abc attempt 1/3 running->success") == (
        "[api:demo] task abc attempt 1/3 running->success"
    )
    # Lines are only searched for shapes when they hold a shape's word; that
    # word is found in any case re.IGNORECASE would accept.
    for line, secret in [
        ("\u017fecret=abcdef123456", "abcdef123456"),  # long s
        ("AUTHOR\u0130ZATION: tok-abcdef123456", "tok-abcdef123456"),  # dotted capital I
        ("author\u0131zation: tok-abcdef123456", "tok-abcdef123456"),  # dotless i
        ("API_\u212aEY=k-abcdef123456", "k-abcdef123456"),  # Kelvin sign
    ]:
        assert secret not in scrub(line), line


def test_redacting_filter_covers_exceptions_and_json_fields() -> None:
    redact("exception-secret-456")
    try:
        raise RuntimeError("boom with exception-secret-456")
    except RuntimeError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed: %s", ("arg",), exc_info=sys.exc_info()
        )
    assert RedactingFilter().filter(record)
    out = JsonFormatter().format(record)
    assert "exception-secret-456" not in out and json.loads(out)["exception"]

    # The fields come from the call's `extra`, not from the text: a message
    # that merely looks like a task line adds none.
    lookalike = "[web:acct-1] task 0123456789abcdef attempt 2/3 pending->running stage=x"
    record = logging.LogRecord("dispatcher.tasks", logging.INFO, __file__, 1, lookalike, None, None)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == lookalike and "lane" not in line and "state" not in line


def test_a_huge_log_line_is_cut_and_a_secret_across_the_cut_stays_masked() -> None:
    secret = "cut-secret-" + "z" * 20
    redact(secret)
    head = "x" * (MAX_MESSAGE_CHARS - 10)
    for message in (head + secret + "y" * 10_000_000, "id " + "f" * 10_000_000):
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s", (message,), None)
        assert RedactingFilter().filter(record)
        line = json.loads(JsonFormatter().format(record))["message"]
        assert len(line) < MAX_MESSAGE_CHARS + 100 and line.endswith("characters]")
        assert secret[:8] not in line
