"""How a lane claims its next task: what the claim writes, and what it asks first.

The ledger's claiming side (`Ledger` is a `TaskClaims`). A claim is one
statement of the store (`Store.claim_next`), run by the scheduler's round or
refill, or sent with a run's end or a submit's insert (`_next_claim`:
`scheduling.withend`, `tasks.submitclaim`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dispatcher.models import Stage, State, Task
from dispatcher.pricing import AGING_STEP_S, Budget
from dispatcher.scheduling.withend import ClaimWithEnd
from dispatcher.store.base import NextClaim
from dispatcher.store.hosts import Fence, Quota
from dispatcher.tasks.operator import OperatorActions


class TaskClaims(OperatorActions):
    def _announce(self, task: Task, old: State | None, why: str = "") -> None:
        raise NotImplementedError  # the ledger's: logged and published

    async def claim(
        self,
        queues: Sequence[str],
        owner: str,
        *,
        fence: Fence | None = None,
        quota: Quota | None = None,
        budget: Budget | None = None,
        prefer: Sequence[str] = (),
    ) -> Task | None:
        """The lane's next task, run by this host; under the account's lease
        (`fence`, a web account) or a provider's global `quota`, and within the
        provider's daily `budget`, when given; fallbacks that list a `prefer`
        queue earlier are left to its free lane (`scheduling.fallbacks`)."""
        now = self.clock.now()
        ranked, fallbacks = await self._claim_looks(queues)
        task = await self.store.claim_next(
            queues,
            now,
            self._claim_changes(owner, fence, now),
            fence=fence,
            quota=quota,
            budget=budget,
            aging_step_s=self.clock.scaled(AGING_STEP_S),
            prefer=prefer,
            ranked=ranked,
            fallbacks=fallbacks,
        )
        if task is not None:
            self._announce(task, State.PENDING)
        return task

    async def _claim_looks(self, queues: Sequence[str]) -> tuple[bool | None, bool | None]:
        """Whether ranked tasks and fallbacks wait, as a claim on this host is
        told: known here while this host is the only writer (`waitflags`)."""
        if self.flags.shared:
            # Several hosts (PostgreSQL): the claim statement looks itself,
            # in the same round trip; asking first would cost two more.
            return None, None
        ranked = self.flags.ranked(queues)
        if ranked is None:
            ranked = await self.store.ranked_waiting(queues)
            self.flags.answered(ranked=() if ranked else queues)
        return ranked, await self.fallbacks_waiting()

    def _claim_changes(self, owner: str, fence: Fence | None, now: float) -> dict[str, Any]:
        """What a claim writes on the task it takes: this host runs it from now."""
        return {
            "owner": owner,
            "stage": Stage.DISPATCHED,
            "started_at": now,
            "heartbeat_at": now,
            "stage_started_at": now,
            "stage_durations": {},
            "error": None,
            "host": self.host,
            "lease_token": fence.token if fence is not None else None,
        }

    async def _next_claim(self, with_end: ClaimWithEnd) -> NextClaim:
        """What `claim` would send for the lane (`scheduling.withend`)."""
        ranked, fallbacks = await self._claim_looks(with_end.queues)
        now = self.clock.now()
        return NextClaim(
            with_end.queues,
            now,
            self._claim_changes(with_end.owner, None, now),
            quota=with_end.quota,
            aging_step_s=self.clock.scaled(AGING_STEP_S),
            ranked=ranked,
            fallbacks=fallbacks,
        )
