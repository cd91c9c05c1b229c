"""Secrets a runner reports (a vendor echoing the key) are masked before they are stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.clock import FakeClock
from dispatcher.errors import PermanentError
from dispatcher.events import EventBus
from dispatcher.logs import redact
from dispatcher.models import Task
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.ledger import Ledger
from dispatcher.tasks.redaction import MAX_ERROR_BYTES
from dispatcher.tasks.spec import TaskSpec
from tests.support.helpers import api_profile

SECRET = "sk-ledger-test-" + "9" * 24


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    redact(SECRET)
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    profile = api_profile()
    events = EventBus()
    yield Ledger(store, FakeClock(), {profile.name: profile}, events, retry_delay_s=0.0)
    await store.close()


async def _running(ledger: Ledger) -> Task:
    await ledger.submit(TaskSpec("m-api", {"prompt": "p"}))
    task = await ledger.claim(["api-model:m-api"], "prov")
    assert task is not None
    return task


def _file_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.glob("d.db*"))


async def test_an_error_echoing_a_secret_is_stored_masked(ledger: Ledger, tmp_path: Path) -> None:
    task = await _running(ledger)
    echoed = f"HTTP 401: Incorrect API key provided: {SECRET}; also Bearer abcdefghijkl"
    ended = await ledger.fail(task, PermanentError(echoed, kind="http_401"))
    assert ended is not None and ended.error is not None
    stored = (await ledger.get(task.id)).error
    assert stored is not None
    for message in (ended.error.message, stored.message):
        assert SECRET not in message and "abcdefghijkl" not in message
        assert message.startswith("HTTP 401: Incorrect API key provided: ***")
    assert SECRET.encode() not in _file_bytes(tmp_path)


async def test_result_meta_is_scrubbed_and_generated_text_keeps_its_shape(ledger: Ledger) -> None:
    task = await _running(ledger)
    result = {
        "text": f'api_key = "{SECRET}" and api_key = os.environ["KEY"]',
        "files": [],
        "meta": {"status": {"echo": f"Authorization: Bearer {SECRET}", "n": [1, SECRET]}},
    }
    ended = await ledger.succeed(task, result, {})
    assert ended is not None and ended.result is not None
    assert SECRET not in repr(ended.result) and SECRET not in repr(
        (await ledger.get(task.id)).result
    )
    # Only the registered secret left the generated text; its code-like shape stays.
    assert ended.result["text"] == 'api_key = "***" and api_key = os.environ["KEY"]'
    assert ended.result["meta"]["status"]["n"] == [1, "***"]


async def test_a_huge_error_is_stored_cut_and_a_secret_across_the_cut_masked(
    ledger: Ledger, tmp_path: Path
) -> None:
    task = await _running(ledger)
    # A page's error banner of a million characters, the key straddling the cut.
    head = "the page shows an error: " + "x" * (MAX_ERROR_BYTES - 35)
    huge = head + SECRET + "y" * 1_000_000
    await ledger.fail(task, PermanentError(huge, kind="page_error"))
    stored = (await ledger.get(task.id)).error
    attempts = await ledger.store.task_attempts(task.id)
    assert stored is not None and attempts[-1].error is not None
    for message in (stored.message, attempts[-1].error.message):
        assert message.startswith("the page shows an error: xxx")
        assert message.endswith(
            f"[cut: {len(huge)} characters, the first {MAX_ERROR_BYTES} bytes kept]\n"
        )
        assert len(message.encode()) <= MAX_ERROR_BYTES
        assert "sk-ledger" not in message  # not even the part before the cut
    assert b"y" * 100 not in _file_bytes(tmp_path)  # nor the megabyte after it
