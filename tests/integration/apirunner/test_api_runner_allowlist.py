"""The outbound allowlist refuses unknown hosts before a byte is sent."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from dispatcher.errors import HostNotAllowed

if TYPE_CHECKING:
    from tests.integration.apirunner.conftest import Kit


async def test_a_profile_host_that_was_not_loaded_is_refused(kit: Kit) -> None:
    # "localhost" reaches the very same demo server, so any byte sent would
    # show up in its stats; only 127.0.0.1 was named by the loaded profiles.
    port = kit.demo.server.port
    profile = kit.profiles["demo-video"]
    assert profile.api is not None
    stray = profile.model_copy(
        update={"api": profile.api.model_copy(update={"base_url": f"http://localhost:{port}"})}
    )
    task = kit.task("demo-video", {"prompt": "exfiltrate"})
    ctx, recorder = kit.ctx(task, stray)
    with pytest.raises(HostNotAllowed, match=f"localhost:{port}") as info:
        await kit.runner.run(task, ctx)
    assert info.value.kind == "allowlist"
    assert recorder.remote_ids == []
    assert (await kit.demo.stats())["requests"] == 0


async def test_a_url_handed_back_by_the_provider_is_checked_too(kit: Kit) -> None:
    # The provider answers the submit with status/result/cancel URLs on a
    # host no profile names: the runner refuses to follow them.
    await kit.demo.mode(mode="foreign_urls", count=1)
    task = kit.task("demo-queue", {"prompt": "follow me", "gen_s": 1})
    with pytest.raises(HostNotAllowed, match=f"localhost:{kit.demo.server.port}"):
        await kit.run(task)
    stats = await kit.demo.stats()
    assert stats["requests"] == 1  # the submit, to the allowed host; nothing else
    assert (stats["polls"], stats["cancels"]) == (0, 0)
