"""The lane's next claim, sent with the end write of the run that freed its slot.

When a run ends, its lane's slot is free and the scheduler claims the lane's
next task at once (`Scheduler._refill`). On PostgreSQL that claim was a round
trip of its own, right after the end write's: sent together, one pipeline
and one transaction (`Store.finish_and_claim`), they are one (issue 31:
round trips per task <= transitions + 1). On SQLite, where a statement is no
round trip, the pair is one transaction: one commit of the WAL, not two.

`claim_with_end` decides, from what the scheduler holds (no I/O), whether a
run's end carries the claim; only where it is the very claim the refill
would make (same statement: the quota counted in it across hosts, SKIP
LOCKED, no `prefer`, as the refill's):

- a run that succeeded or was canceled: what a failure says of the lane (a
  429 cooling the provider down, a storm halving its concurrency) is known
  once it is handled, and the refill decides then;
- an API lane: a web account's claim proves its lease (`fence`) and reads
  its daily allowance first; those keep the refill's path;
- the lane still served and open (not switched off, not cooling down after
  429s), with a slot free once this run's is given back (its effective
  concurrency may have dropped meanwhile);
- no daily budget guarding the provider (a claim under it is followed by
  `BudgetBook.after_claim`, on the refill's path);
- the scheduler not stopping.

The claimed task starts as a refill's would (`ready_to_start`, then
`_start`), under the lane's fill lock, once the ended run's slot is given
back. When the pair fails (one transaction: neither is written), the ledger
writes the end alone and the refill claims, as without the pairing.

The end write, its claim and that start run shielded from a cancel of the
ended run's asyncio task; a task claimed while the scheduler began to stop,
or while the lane was dropped (a reload), is given back (pending again,
same attempt). Only if the process dies between the claim and the start is
the task left running without a runner: the stale bound (90 s) reclaims
it, as any claim cut short.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dispatcher.models import Kind, Task
from dispatcher.scheduling.decisions import LaneSnapshot, free_slots
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.store.hosts import Fence, Quota


@dataclass
class ClaimWithEnd:
    """A lane's claim to send with a run's end write (`Ledger.succeed`,
    `mark_canceled`), and what came of it."""

    queues: tuple[str, ...]
    owner: str
    quota: Quota | None = None
    # Set by the ledger's end write: whether the store sent the claim with it
    # (False: it declined, and the refill claims as ever), and what it claimed.
    sent: bool = False
    claimed: Task | None = None


def claim_with_end(
    lane: LaneSpec,
    snapshot: LaneSnapshot,
    *,
    fence: Fence | None,
    quota: Quota | None,
    budgeted: bool,
    stopping: bool,
    failed: bool = False,
    freeing: bool = True,
) -> ClaimWithEnd | None:
    """The claim the end of one of `lane`'s runs carries, or None.

    `snapshot` is taken while the ending run still holds its slot; `fence`
    and `quota` are the lane's claim guard; `budgeted`: a daily budget guards
    the lane's provider now; `failed`: the run ended with an error.
    `freeing=False`: no run ends (a submit's insert carries the claim,
    `tasks.submitclaim`), a slot must be free now.
    """
    if failed or stopping or lane.kind is not Kind.API or fence is not None or budgeted:
        return None
    running = max(0, snapshot.running - 1) if freeing else snapshot.running
    if free_slots(replace(snapshot, running=running)) < 1:
        return None
    return ClaimWithEnd(tuple(lane.queues), lane.owner, quota)


__all__ = ["ClaimWithEnd", "claim_with_end"]
