"""Browser faults in the real service: a renderer killed mid-generation, and a
Chromium that cannot start (real Chromium against the bundled demo web model)."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import psutil
import pytest

from dispatcher.accounts.health import (
    DEFAULT_FAILURES_FOR_ATTENTION as BROWSER_START_FAILURES_FOR_ATTENTION,
)
from dispatcher.errors import ConfigError
from dispatcher.settings import find_browser
from tests.integration.test_web_lanes import account_browsers, unknown_browsers
from tests.support.harness import Harness, running_service

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

SCALE = 0.05


def renderers(state_dir: Path, account: str) -> list[psutil.Process]:
    return [p for p in account_browsers(state_dir, account) if "--type=renderer" in p.cmdline()]


async def wait_stage(h: Harness, task_id: str, stage: str, timeout_s: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await h.task(task_id)).get("stage") != stage:
        assert asyncio.get_running_loop().time() < deadline, await h.task(task_id)
        await asyncio.sleep(0.05)


async def test_a_renderer_killed_mid_generation_is_retried_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    # Prewarm off: the launches counted are the first task's and its retry's
    # (pre-started browsers, one per account, would add to them).
    async with running_service(
        tmp_path, profiles=("demo-chat",), time_scale=SCALE, browser_prewarm=False
    ) as h:
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "one web lane"})
        task = await h.submit("demo-chat", "a long answer [duration=40]")
        await wait_stage(h, task["id"], "generating")
        victims = renderers(h.state_dir, "demo-1")
        assert victims, "no renderer found for the running page"
        for proc in victims:
            proc.kill()

        done = await h.wait_task(task["id"], timeout_s=60)
        assert done["state"] == "success", done
        assert done["attempt"] == 2  # the crash cost one attempt, nothing more
        # The crashed browser was killed with its family; only the one kept
        # from the successful retry is still on the profile.
        assert unknown_browsers(h, "demo-1") == []
        assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in victims)
        metrics = (await h.http.get("/metrics")).text
        assert "dispatcher_browser_launches_total 2.0" in metrics
    assert account_browsers(tmp_path / "state", "demo-1") == []


def breakable_browser(tmp_path: Path, real: str) -> tuple[Path, Path, Path]:
    """A Chromium wrapper that counts its launches and fails at once while `broken` exists."""
    launches = tmp_path / "launches.log"
    broken = tmp_path / "broken"
    script = tmp_path / "chromium"
    script.write_text(
        "#!/bin/sh\n"
        f"echo launch >> '{launches}'\n"
        f"if [ -e '{broken}' ]; then\n"
        "  echo 'chromium: error while loading shared libraries: libnss3.so: "
        "cannot open shared object file' >&2\n"
        "  exit 127\n"
        "fi\n"
        f"exec '{real}' \"$@\"\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, launches, broken


def launch_count(launches: Path) -> int:
    return len(launches.read_text().splitlines()) if launches.exists() else 0


async def test_a_browser_that_cannot_start_takes_the_account_out_without_a_launch_loop(
    tmp_path: Path,
) -> None:
    real = find_browser()
    assert real is not None
    script, launches, broken = breakable_browser(tmp_path, real)
    # Prewarm off: every launch of the wrapper is counted from `at_start` on,
    # and a browser started in the background as the lanes open would race
    # that reading.
    async with running_service(
        tmp_path,
        profiles=("demo-chat",),
        time_scale=SCALE,
        browser_executable=str(script),
        browser_prewarm=False,
    ) as h:
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "one web lane"})
        at_start = launch_count(launches)  # the demo's log-ins
        broken.touch()  # e.g. an upgrade removed a library Chromium needs
        tasks = [(await h.submit("demo-chat", name))["id"] for name in ("first", "second")]

        deadline = asyncio.get_running_loop().time() + 60
        while not (account := (await h.accounts())["demo-1"])["needs_attention"]:
            assert asyncio.get_running_loop().time() < deadline, "the account was never marked"
            await asyncio.sleep(0.05)
        assert "failed to start 3 times in a row" in str(account["reason"])
        assert "exited with code 127" in str(account["reason"])
        assert "libnss3.so" in str(account["reason"])
        # Both tasks wait for the operator, each with the error of its last try;
        # nothing failed for good (the browser, not the task, is broken).
        for task_id in tasks:
            task = await h.task(task_id)
            assert task["state"] == "pending", task
            assert task["error"]["kind"] == "browser_start"
            assert "libnss3.so" in task["error"]["message"]
        # No launch loop: three tries (one per retry delay), then none while
        # the account is out of service.
        await asyncio.sleep(1.0)  # four scaled retry delays: time enough for a loop to show
        assert launch_count(launches) - at_start == BROWSER_START_FAILURES_FOR_ATTENTION
        assert account_browsers(h.state_dir, "demo-1") == []

        # The operator repairs the machine and puts the account back: nothing was lost.
        broken.unlink()
        await h.http.post("/v1/accounts/demo-1/enable")
        for task_id in tasks:
            done = await h.wait_task(task_id, timeout_s=60)
            assert done["state"] == "success", done
        # One launch for both: the browser is kept between the two tasks.
        assert launch_count(launches) - at_start == BROWSER_START_FAILURES_FOR_ATTENTION + 1


async def test_a_browser_path_that_is_not_executable_is_refused_at_start(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-chromium"
    with pytest.raises(ConfigError, match=f"browser {missing} is not an executable file"):
        async with running_service(
            tmp_path, profiles=("demo-chat",), time_scale=SCALE, browser_executable=str(missing)
        ):
            pass
    assert not os.path.exists(tmp_path / "state" / "port")
