"""The ledger's log line for a state change: words for people, fields for jq."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.clock import FakeClock
from dispatcher.events import EventBus
from dispatcher.logs import JsonFormatter
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


def fields(record: logging.LogRecord) -> dict[str, object]:
    line = json.loads(JsonFormatter().format(record))
    return {k: v for k, v in line.items() if k not in ("ts", "logger", "level", "message")}


async def test_a_task_is_one_line_per_state_change_with_its_fields(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="dispatcher.tasks"):
        submitted = await ledger.submit(TaskSpec("m-api", {"prompt": "p"}))
        task = await ledger.claim(["api-model:m-api"], "prov")
    assert task is not None
    new, claimed = caplog.records
    tid = submitted.task.id
    assert new.getMessage() == f"[api-model:m-api] task {tid} attempt 1/3 new pending stage=-"
    assert fields(new) == {
        "lane": "api-model:m-api",
        "task_id": tid,
        "attempt": 1,
        "max_attempts": 3,
        "state": "pending",
    }
    assert claimed.getMessage() == (
        f"[api:prov] task {tid} attempt 1/3 pending->running stage=dispatched"
    )
    assert fields(claimed) == {
        "lane": "api:prov",
        "task_id": tid,
        "attempt": 1,
        "max_attempts": 3,
        "from_state": "pending",
        "state": "running",
        "stage": "dispatched",
    }


async def test_a_rejected_late_write_names_its_task_but_claims_no_state(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """A write that changed nothing must not look like a state change to `jq`."""
    await ledger.submit(TaskSpec("m-api", {"prompt": "p"}))
    task = await ledger.claim(["api-model:m-api"], "prov")
    assert task is not None
    assert await ledger.requeue(task, "moved on") is not None
    with caplog.at_level(logging.WARNING, logger="dispatcher.tasks"):
        assert await ledger.heartbeat(task, None) is None  # the stale view of the row
    (record,) = caplog.records
    assert "late write running->running rejected" in record.getMessage()
    assert fields(record) == {"lane": "api:prov", "task_id": task.id, "attempt": 1}
