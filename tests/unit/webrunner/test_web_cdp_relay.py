"""The DevTools relay's listening socket (`webrunner.cdppipe`) is closed
whatever interrupts its set-up: a stop or a cancel landing while a browser
starts must leave nothing listening on loopback.

asyncio's `create_server` makes the server, starts serving, then waits one
turn of the loop; cancelled in that turn, it drops the server it made,
listening, and nobody would close it (CI met it as a ResourceWarning when
the loop closed: `unclosed <socket ... laddr=('127.0.0.1', ...)>`)."""

from __future__ import annotations

import asyncio
import contextlib
import os

import psutil

from webrunner.cdppipe import CdpPipe


def _listening() -> set[int]:
    """The loopback ports this process listens on."""
    return {
        c.laddr.port
        for c in psutil.Process(os.getpid()).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.ip == "127.0.0.1"
    }


async def test_a_relay_cancelled_at_any_step_of_its_set_up_leaves_nothing_listening() -> None:
    before = _listening()
    opened = 0
    for steps in range(8):
        pipe = CdpPipe()
        opening = asyncio.ensure_future(pipe.open())
        for _ in range(steps):
            await asyncio.sleep(0)
        opening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await opening
        if not opening.cancelled():
            opened += 1  # set up before the cancel came: closed as any relay is
        await pipe.close()
        assert _listening() == before, f"cancelled after {steps} turns of the loop"
    # The later cancels came once it was up: every step of the set-up was met.
    assert opened > 0


async def test_a_relay_listens_until_closed() -> None:
    before = _listening()
    pipe = CdpPipe()
    url = await pipe.open()
    port = int(url.split(":")[2].split("/")[0])
    assert _listening() == before | {port}
    await pipe.close()
    assert _listening() == before
