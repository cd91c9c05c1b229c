"""A submit's insert carrying its lane's next claim (PostgreSQL: one round trip).

A task submitted while a lane serving it had a free slot was inserted, then
claimed by the scheduler's round a moment later: two round trips, two
commits, and every other host heard it pending (issue 31: at a steady 40
tasks a second a task cost 3.1 round trips on one host, 3.2 on three). When
the store saves a round trip by it (`Store.claims_on_insert`) and the
scheduler says a lane could claim now (`InsertClaims.claim_with`: the
conditions of a claim carried by a run's end, `scheduling.withend`, with
the slot free now), the lane's claim is sent with the insert, one
transaction: it takes the lane's next task in line, the new one when none
waits before it. The scheduler holds the lane's fill lock meanwhile (the
slot is not taken twice) and starts the task claimed as a refill would.

A failure of the pair writes neither (one transaction): the task is then
inserted alone, and the scheduler's round claims it as ever.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from dispatcher.errors import StoreError
from dispatcher.models import State, Task
from dispatcher.scheduling.withend import ClaimWithEnd
from dispatcher.store import NextClaim, Store

log = logging.getLogger("dispatcher.tasks.submitclaim")


class InsertClaims(Protocol):
    def claim_with(self, task: Task) -> AbstractAsyncContextManager[ClaimWithEnd | None]:
        """The claim a lane serving `task` would make now (None: none), held
        for the insert; on leaving, the task it claimed (`claimed`) is started."""


async def insert_claiming(
    store: Store,
    claims: InsertClaims,
    task: Task,
    created_since: float,
    next_claim: Callable[[ClaimWithEnd], Awaitable[NextClaim]],
    announce: Callable[[Task, State | None], None],
) -> tuple[Task, bool]:
    """`store.insert_unless_twin`'s answer (the new task as claimed, when its
    own lane took it); the new task (if inserted) and the task claimed with it
    (if any) announced, in that order."""
    async with claims.claim_with(task) as with_claim:
        both = None
        if with_claim is not None:
            claim = await next_claim(with_claim)
            try:
                both = await store.insert_and_claim(task, created_since, claim)
            except StoreError as exc:
                log.warning("task %s: insert and claim failed (%s); inserting alone", task.id, exc)
        if both is None:
            stored, inserted = await store.insert_unless_twin(task, created_since)
            claimed = None
        else:
            assert with_claim is not None
            stored, inserted, claimed = both
            with_claim.sent, with_claim.claimed = True, claimed
        if inserted:
            announce(stored, None)
        if claimed is not None:
            announce(claimed, State.PENDING)
            if inserted and claimed.id == stored.id:
                # The new task is the one claimed: the submit's answer says
                # so (running, on this host), not the row a moment before.
                stored = claimed
        return stored, inserted
