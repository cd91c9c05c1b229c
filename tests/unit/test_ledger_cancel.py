"""A cancel asked for while an attempt runs wins over how the attempt ends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.clock import FakeClock
from dispatcher.errors import PermanentError, TransientError
from dispatcher.events import EventBus
from dispatcher.ledger import Ledger
from dispatcher.models import State, Task
from dispatcher.store.sqlite import SqliteStore
from dispatcher.taskspec import TaskSpec
from tests.helpers import api_profile


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    store = SqliteStore(tmp_path / "d.db")
    store.migrate()
    profile = api_profile()
    yield Ledger(store, FakeClock(), {profile.name: profile}, EventBus(), retry_delay_s=0.0)
    store.close()


def _running_with_cancel_asked(ledger: Ledger) -> Task:
    asyncio.run(ledger.submit(TaskSpec("m-api", {"prompt": "p"})))
    task = ledger.claim(["api-model:m-api"], "prov")
    assert task is not None
    assert ledger.request_cancel(task.id).cancel_requested
    return task  # the runner's view: taken before the cancel


def test_a_result_after_cancel_is_dropped(ledger: Ledger) -> None:
    task = _running_with_cancel_asked(ledger)
    ended = asyncio.run(ledger.succeed(task, {"text": "too late"}, {"generating": 1.0}))
    assert ended is not None and ended.state is State.CANCELED and ended.result is None


@pytest.mark.parametrize("error", [TransientError("boom"), PermanentError("no")])
def test_an_error_after_cancel_ends_canceled_not_failed_or_retried(
    ledger: Ledger, error: TransientError | PermanentError
) -> None:
    task = _running_with_cancel_asked(ledger)
    ended = ledger.fail(task, error)
    assert ended is not None and ended.state is State.CANCELED
    assert ended.attempt == task.attempt  # no retry was queued
