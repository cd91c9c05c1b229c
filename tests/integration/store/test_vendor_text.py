"""What a runner reports in a vendor's or a page's words is stored on both stores alike.

PostgreSQL refuses a NUL in text and neither store takes a lone surrogate;
the ledger (and the account book, for reasons) make such text storable, so
the write that ends an attempt never fails on it.
"""

from __future__ import annotations

from dispatcher.accounts.switches import AccountBook
from dispatcher.clock import FakeClock
from dispatcher.errors import PermanentError
from dispatcher.events import EventBus
from dispatcher.models import Kind, State
from dispatcher.store import Store
from dispatcher.tasks.ledger import Ledger
from dispatcher.tasks.spec import TaskSpec
from tests.support.helpers import api_profile

HOSTILE = "bad\x00news \ud800 here"
STORED = "bad\ufffdnews \ufffd here"


async def _ledger(store: Store) -> Ledger:
    profile = api_profile()
    return Ledger(store, FakeClock(), {profile.name: profile}, EventBus(), retry_delay_s=0.0)


async def test_an_error_and_a_result_holding_a_nul_are_stored_alike(store: Store) -> None:
    ledger = await _ledger(store)
    for prompt in ("one", "two"):
        await ledger.submit(TaskSpec("m-api", {"prompt": prompt}))
    failing = await ledger.claim(["api-model:m-api"], "prov")
    assert failing is not None
    failing = await ledger.record_remote_id(failing, '{"id": "j", "submit": {"x": "a\x00"}}')
    ended = await ledger.fail(failing, PermanentError(HOSTILE, kind="remote\x00failed"))
    assert ended is not None and ended.state is State.FAILED
    stored = await ledger.get(failing.id)
    assert stored.error is not None
    assert (stored.error.kind, stored.error.message) == ("remote\ufffdfailed", STORED)
    attempts = await store.task_attempts(failing.id)
    assert [a.error.message for a in attempts if a.error] == [STORED]

    succeeding = await ledger.claim(["api-model:m-api"], "prov")
    assert succeeding is not None
    result = {"text": HOSTILE, "files": [], "meta": {"remote_state": HOSTILE, HOSTILE: [HOSTILE]}}
    done = await ledger.succeed(succeeding, result, {})
    assert done is not None and done.state is State.SUCCESS
    back = (await ledger.get(succeeding.id)).result
    assert back == {"text": STORED, "files": [], "meta": {"remote_state": STORED, STORED: [STORED]}}


async def test_an_account_reason_holding_a_nul_is_stored(store: Store) -> None:
    book = await AccountBook.load(store, FakeClock(), EventBus())
    await book.ensure([("prov", Kind.API)])
    await book.needs_attention("prov", f"the provider refused the key: {HOSTILE}")
    reloaded = await AccountBook.load(store, FakeClock(), EventBus())
    assert reloaded.get("prov").reason == f"the provider refused the key: {STORED}"
