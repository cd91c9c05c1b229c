"""The keeper's stop closes every kept browser at once, not one after another:
twenty browsers closed in turn, each up to its grace period on a loaded
machine, outlast a service manager's stop timeout (the service is then
killed and its browsers are left running)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from webrunner.browser import BrowserSession, Log
from webrunner.keeper import BrowserKeeper

ACCOUNTS = ("a", "b", "c")


class _Session:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.closed = False


@pytest.mark.asyncio
async def test_stop_closes_the_kept_browsers_together() -> None:
    in_flight: set[int] = set()
    everyone_closing = asyncio.Event()

    async def close(session: BrowserSession, log: Log) -> None:
        in_flight.add(session.pid)
        if len(in_flight) == len(ACCOUNTS):
            everyone_closing.set()
        # Each close lasts until all of them have begun: closed one by one,
        # the first would never end.
        await everyone_closing.wait()

    keeper = BrowserKeeper(ACCOUNTS, keep_alive_s=600.0, close=close)
    for pid, account in enumerate(ACCOUNTS, start=100):
        keeper.adopt(account, cast(BrowserSession, _Session(pid)))
    await asyncio.wait_for(keeper.aclose(), timeout=10.0)
    assert in_flight == {100, 101, 102}
    assert keeper.open_browsers() == {}
