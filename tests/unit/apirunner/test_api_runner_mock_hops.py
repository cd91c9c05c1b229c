"""Redirects met by the API runner's requests, checked hop by hop, in process.

The key goes only to the profile's own host; a hop to a host no profile
names is refused before a byte is sent there; a redirect loop ends.
(`tests/unit/test_fetch_hops.py` covers the hop loop itself.)
"""

from __future__ import annotations

import pytest

from dispatcher.errors import HostNotAllowed, PermanentError
from dispatcher.fetch import MAX_HOPS
from tests.unit.apirunner.mock_vendor import (
    CDN,
    FOREIGN,
    KEY,
    SUBMIT,
    Bench,
    answer,
    cancel_url,
    content_url,
    redirect,
    status_url,
)

VIDEO = b"mp4-bytes" * 100


def job_done(mock: Bench) -> None:
    mock.vendor.on(*SUBMIT, answer(200, {"id": "video_1"}))
    mock.vendor.on("GET", status_url("video_1"), answer(200, {"status": "completed"}))
    mock.vendor.on("POST", cancel_url("video_1"), answer(200, {}))


async def test_a_result_redirected_to_an_allowed_cdn_goes_there_without_the_key(
    mock: Bench,
) -> None:
    job_done(mock)
    mock.vendor.on("GET", content_url("video_1"), redirect(f"{CDN}/files/v1.mp4"))
    mock.vendor.on(
        "GET", f"{CDN}/files/v1.mp4", answer(200, VIDEO, **{"content-type": "video/mp4"})
    )
    result, _ = await mock.run()

    [home] = mock.vendor.to("GET", content_url("video_1"))
    [cdn] = mock.vendor.to("GET", f"{CDN}/files/v1.mp4")
    assert home.headers["authorization"] == f"Bearer {KEY}"
    assert "authorization" not in cdn.headers
    assert result.files[0].size == len(VIDEO)


async def test_a_redirect_back_home_carries_the_key_again(mock: Bench) -> None:
    job_done(mock)
    mock.vendor.on("GET", content_url("video_1"), redirect(f"{CDN}/bounce"))
    mock.vendor.on("GET", f"{CDN}/bounce", redirect(f"{content_url('video_1')}?signed=1"))
    mock.vendor.on(
        "GET",
        f"{content_url('video_1')}?signed=1",
        answer(200, VIDEO, **{"content-type": "video/mp4"}),
    )
    await mock.run()
    [bounce] = mock.vendor.to("GET", f"{CDN}/bounce")
    [signed] = mock.vendor.to("GET", f"{content_url('video_1')}?signed=1")
    assert "authorization" not in bounce.headers
    assert signed.headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("step", ["submit", "poll", "result"])
async def test_a_hop_to_a_host_no_profile_names_is_refused_before_it_is_sent(
    mock: Bench, step: str
) -> None:
    job_done(mock)
    away = redirect(f"{FOREIGN}/collect")
    if step == "submit":
        mock.vendor.on(*SUBMIT, away)
    elif step == "poll":
        mock.vendor.on("GET", status_url("video_1"), away)
    else:
        mock.vendor.on("GET", content_url("video_1"), away)
    with pytest.raises(HostNotAllowed, match=r"elsewhere\.test"):
        await mock.run()
    assert not [s for s in mock.vendor.sent if s.url.startswith(FOREIGN)]
    assert len(mock.vendor.to(*SUBMIT)) == 1


async def test_a_redirect_loop_ends_after_the_hop_limit(mock: Bench) -> None:
    job_done(mock)
    mock.vendor.on("GET", content_url("video_1"), redirect(f"{CDN}/a"))
    mock.vendor.on("GET", f"{CDN}/a", redirect(content_url("video_1")))
    with pytest.raises(PermanentError, match="redirects") as caught:
        await mock.run()
    assert caught.value.kind == "redirects"
    hops = [s for s in mock.vendor.sent if s.url in (content_url("video_1"), f"{CDN}/a")]
    assert len(hops) == MAX_HOPS + 1  # one download, not retried: a loop stays a loop


async def test_a_refusal_from_a_host_that_never_saw_the_key_is_not_about_the_key(
    mock: Bench,
) -> None:
    """An expired signed URL on a CDN answers 403: the task fails, the lane is not held."""
    job_done(mock)
    mock.vendor.on("GET", content_url("video_1"), redirect(f"{CDN}/files/expired.mp4"))
    mock.vendor.on("GET", f"{CDN}/files/expired.mp4", answer(403, {"error": "Request expired"}))
    with pytest.raises(PermanentError) as failed:
        await mock.run()
    assert failed.value.kind == "url_refused"
    assert "expired or foreign URL" in failed.value.message
