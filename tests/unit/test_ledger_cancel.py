"""A cancel asked for while an attempt runs wins over how the attempt ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.clock import FakeClock
from dispatcher.errors import PermanentError, TransientError
from dispatcher.events import EventBus
from dispatcher.models import State, Task
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.ledger import Ledger
from dispatcher.tasks.spec import TaskSpec
from tests.support.helpers import api_profile


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    profile = api_profile()
    yield Ledger(store, FakeClock(), {profile.name: profile}, EventBus(), retry_delay_s=0.0)
    await store.close()


async def _running_with_cancel_asked(ledger: Ledger) -> Task:
    await ledger.submit(TaskSpec("m-api", {"prompt": "p"}))
    task = await ledger.claim(["api-model:m-api"], "prov")
    assert task is not None
    assert (await ledger.request_cancel(task.id)).cancel_requested
    return task  # the runner's view: taken before the cancel


async def test_a_result_after_cancel_is_dropped(ledger: Ledger) -> None:
    task = await _running_with_cancel_asked(ledger)
    ended = await ledger.succeed(task, {"text": "too late"}, {"generating": 1.0})
    assert ended is not None and ended.state is State.CANCELED and ended.result is None


@pytest.mark.parametrize("error", [TransientError("boom"), PermanentError("no")])
async def test_an_error_after_cancel_ends_canceled_not_failed_or_retried(
    ledger: Ledger, error: TransientError | PermanentError
) -> None:
    task = await _running_with_cancel_asked(ledger)
    ended = await ledger.fail(task, error)
    assert ended is not None and ended.state is State.CANCELED
    assert ended.attempt == task.attempt  # no retry was queued
