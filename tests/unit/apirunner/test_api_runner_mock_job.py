"""The API runner's decisions for one async job, against a provider in process.

Submit, poll, download; what a 429, a 5xx, a Retry-After or an unreadable
answer does at each step; a refused remote id; a cancel while polling. The
demo provider covers the same paths end to end (tests/integration/apirunner).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from apirunner.attempt import MAX_POLL_ERRORS
from apirunner.classify import MAX_ERRORS_IN_PLACE
from dispatcher.errors import PermanentError, TaskCanceled, TransientError
from dispatcher.scheduling.protocol import Interruption
from tests.unit.apirunner.mock_vendor import (
    KEY,
    SUBMIT,
    Bench,
    answer,
    cancel_url,
    content_url,
    status_url,
)

VIDEO = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8


def job_runs(mock: Bench, job_id: str = "video_1", *statuses: str) -> None:
    """Script a job that is accepted, goes through `statuses`, and has a file."""
    mock.vendor.on(*SUBMIT, answer(200, {"id": job_id, "status": "queued"}))
    mock.vendor.on(
        "GET",
        status_url(job_id),
        *[answer(200, {"id": job_id, "status": s, "progress": 50}) for s in statuses],
        answer(200, {"id": job_id, "status": "completed", "progress": 100}),
    )
    mock.vendor.on("GET", content_url(job_id), answer(200, VIDEO, **{"content-type": "video/mp4"}))
    mock.vendor.on("POST", cancel_url(job_id), answer(200, {"id": job_id}))


async def test_a_job_is_submitted_once_polled_to_its_end_and_its_file_streamed(
    mock: Bench,
) -> None:
    job_runs(mock, "video_1", "queued", "in_progress")
    task = mock.task("a cat on a skateboard")
    result, reports = await mock.run(task)

    [submit] = mock.vendor.to(*SUBMIT)
    assert submit.headers["authorization"] == f"Bearer {KEY}"
    assert submit.headers["idempotency-key"] == f"{task.id}-1"
    assert submit.body == b'{"prompt":"a cat on a skateboard"}'
    # The remote id is stored before anything else is reported.
    assert reports.events[0] == "remote_id" and reports.remote_ids == ["video_1"]
    assert reports.events[-1] == "stage:downloading"
    assert len(mock.vendor.to("GET", status_url("video_1"))) == 3
    assert mock.vendor.to("POST", cancel_url("video_1")) == []

    [file] = result.files
    assert Path(file.path).read_bytes() == VIDEO
    assert (file.size, file.content_type) == (len(VIDEO), "video/mp4")
    assert file.sha256 == hashlib.sha256(VIDEO).hexdigest()
    assert not list(Path(file.path).parent.glob("*.part"))
    assert result.meta["remote_id"] == "video_1" and result.meta["polls"] == 3


async def test_a_resumed_job_polls_without_submitting_again(mock: Bench) -> None:
    job_runs(mock, "video_7")
    result, reports = await mock.run(mock.task(remote_id="video_7", started_at=0.0))
    assert mock.vendor.to(*SUBMIT) == []
    assert reports.remote_ids == []
    assert result.files and result.meta["remote_id"] == "video_7"


async def test_a_submit_retry_after_holds_the_next_submit_exactly_that_long(mock: Bench) -> None:
    job_runs(mock)
    mock.vendor.on(
        *SUBMIT,
        answer(429, {"error": {"message": "slow down"}}, **{"retry-after": "7"}),
        answer(200, {"id": "video_1"}),
    )
    task = mock.task()
    await mock.run(task)
    first, second = mock.vendor.to(*SUBMIT)
    assert 7.0 <= second.at_s - first.at_s < 7.1  # the gate, not the backoff schedule
    # The same Idempotency-Key: the provider can tell it is the same request.
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"]


async def test_a_poll_retry_after_replaces_the_poll_schedule(mock: Bench) -> None:
    job_runs(mock)
    mock.vendor.on(
        "GET",
        status_url("video_1"),
        answer(429, {}, **{"retry-after": "30"}),
        answer(200, {"status": "completed"}),
    )
    await mock.run()
    limited, done = mock.vendor.to("GET", status_url("video_1"))
    assert 30.0 <= done.at_s - limited.at_s < 30.1


async def test_5xx_on_submit_is_retried_in_place_with_the_same_key(mock: Bench) -> None:
    job_runs(mock)
    mock.vendor.on(*SUBMIT, answer(503), answer(502), answer(200, {"id": "video_1"}))
    result, _ = await mock.run()
    keys = {s.headers["idempotency-key"] for s in mock.vendor.to(*SUBMIT)}
    assert len(mock.vendor.to(*SUBMIT)) == 3 and len(keys) == 1
    assert result.files


async def test_a_submit_that_keeps_failing_ends_the_attempt_as_transient(mock: Bench) -> None:
    mock.vendor.on(*SUBMIT, answer(500, {"error": {"message": "overloaded"}}))
    with pytest.raises(TransientError, match="HTTP 500: overloaded") as caught:
        await mock.run()
    assert caught.value.kind == "http_500"
    assert len(mock.vendor.to(*SUBMIT)) == MAX_ERRORS_IN_PLACE


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (400, "prompt is required", "http_400"),
        (401, "invalid api key", "http_401"),
        (422, "rejected by the content policy", "refused"),
    ],
)
async def test_a_4xx_on_submit_is_permanent_and_sent_once(
    mock: Bench, status: int, message: str, kind: str
) -> None:
    mock.vendor.on(*SUBMIT, answer(status, {"error": {"message": message}}))
    with pytest.raises(PermanentError, match=message) as caught:
        await mock.run()
    assert caught.value.kind == kind
    assert len(mock.vendor.sent) == 1


async def test_polls_go_on_through_429s_and_5xx(mock: Bench) -> None:
    job_runs(mock)
    mock.vendor.on(
        "GET",
        status_url("video_1"),
        answer(429, {}),
        answer(502, "<html>bad gateway</html>"),
        answer(503),
        answer(200, {"status": "completed"}),
    )
    result, _ = await mock.run()
    assert len(mock.vendor.to("GET", status_url("video_1"))) == 4
    assert len(mock.vendor.to(*SUBMIT)) == 1
    assert result.meta["polls"] == 1  # the answered poll; failed ones are not counted


async def test_polls_failing_in_a_row_end_the_attempt_and_cancel_the_job(mock: Bench) -> None:
    job_runs(mock)
    mock.vendor.on("GET", status_url("video_1"), answer(500))
    with pytest.raises(TransientError, match="HTTP 500"):
        await mock.run()
    assert len(mock.vendor.to("GET", status_url("video_1"))) == MAX_POLL_ERRORS
    assert len(mock.vendor.to("POST", cancel_url("video_1"))) == 1  # it stops holding quota


async def test_an_unreadable_2xx_submit_is_never_sent_again(mock: Bench) -> None:
    # A 2xx means the job exists: a second submit would pay for a second one.
    mock.vendor.on(*SUBMIT, answer(200, "<html>gateway says hi</html>"))
    with pytest.raises(PermanentError) as caught:
        await mock.run()
    assert caught.value.kind == "bad_answer"
    assert len(mock.vendor.sent) == 1


async def test_an_unreadable_2xx_poll_is_a_failed_poll_not_a_new_submit(mock: Bench) -> None:
    job_runs(mock)
    mock.vendor.on(
        "GET",
        status_url("video_1"),
        answer(200, "<html>maintenance</html>"),
        answer(200, {"status": "completed"}),
    )
    result, _ = await mock.run()
    assert len(mock.vendor.to(*SUBMIT)) == 1
    assert len(mock.vendor.to("GET", status_url("video_1"))) == 2
    assert result.files


@pytest.mark.parametrize("job_id", ["../admin", "a/b", "..", "id\nX-Injected: 1", ""])
async def test_a_remote_id_that_would_change_the_url_is_refused(mock: Bench, job_id: str) -> None:
    mock.vendor.on(*SUBMIT, answer(200, {"id": job_id}))
    with pytest.raises(PermanentError) as caught:
        await mock.run()
    assert caught.value.kind == "bad_answer"
    assert len(mock.vendor.sent) == 1  # no poll, no cancel: nothing built from that id


async def test_a_cancel_while_polling_stops_at_once_and_cancels_the_remote_job(
    mock: Bench,
) -> None:
    job_runs(mock)
    task = mock.task()
    ctx, reports = mock.ctx(task)

    def second_poll_sees_a_cancel(request: httpx.Request) -> httpx.Response:
        ctx.interrupt(Interruption.CANCELED)  # an operator's cancel arrives while the job runs
        return answer(200, {"status": "in_progress", "progress": 40})(request)

    mock.vendor.on(
        "GET",
        status_url("video_1"),
        answer(200, {"status": "queued"}),
        second_poll_sees_a_cancel,
    )
    with pytest.raises(TaskCanceled):
        await mock.runner.run(task, ctx)
    assert len(mock.vendor.to("GET", status_url("video_1"))) == 2
    assert len(mock.vendor.to("POST", cancel_url("video_1"))) == 1
    assert mock.vendor.to("GET", content_url("video_1")) == []
    assert reports.remote_ids == ["video_1"]


async def test_a_download_5xx_is_retried_and_the_file_is_whole(mock: Bench) -> None:
    job_runs(mock)
    mock.vendor.on(
        "GET",
        content_url("video_1"),
        answer(503),
        answer(200, VIDEO, **{"content-type": "video/mp4"}),
    )
    result, _ = await mock.run()
    [file] = result.files
    assert Path(file.path).read_bytes() == VIDEO
    assert len(mock.vendor.to("GET", content_url("video_1"))) == 2
    assert len(mock.vendor.to(*SUBMIT)) == 1
