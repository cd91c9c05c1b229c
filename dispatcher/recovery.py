"""Start-up recovery: the fate of each task a previous run left `running`.

`decide` is pure (one task, the time, the bounds: what happens to it);
`recover` applies the decisions through the ledger and counts them. The
rules per kind are `decisions.plan_recovery`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass

from dispatcher.decisions import Reclaim, RecoveryAction, plan_recovery, reclaim_plan
from dispatcher.ledger import Ledger
from dispatcher.models import Task

log = logging.getLogger("dispatcher.service")


@dataclass(frozen=True)
class Recovery:
    action: RecoveryAction
    # For STALE: the retry rule's verdict, as a stale reclaim would give it.
    reclaim: Reclaim | None = None


def decide(task: Task, *, now: float, expire_after_s: float, retry_delay_s: float) -> Recovery:
    """What start-up does with one task a previous run left running."""
    action = plan_recovery(task, now=now, expire_after_s=expire_after_s)
    if action is not RecoveryAction.STALE:
        return Recovery(action)
    # Its browser died with the previous run: stale now, whatever its heartbeat says.
    return Recovery(action, reclaim_plan(task, now=now, retry_delay_s=retry_delay_s))


async def recover(
    running: Iterable[Task],
    *,
    ledger: Ledger,
    models: Collection[str],
    adopt: Callable[[Task], Awaitable[bool]],
    now: float,
    expire_after_s: float,
    retry_delay_s: float,
) -> dict[str, int]:
    """Apply each loaded model's task's fate; log one line; the counts by action.

    `adopt` hands an API task with a remote id to its lane to resume polling;
    it answers False when that lane is gone. Tasks of models not loaded now
    stay as they are until their model is back.
    """
    summary = {action.value: 0 for action in RecoveryAction}
    for task in running:
        if task.model not in models:
            continue
        fate = decide(task, now=now, expire_after_s=expire_after_s, retry_delay_s=retry_delay_s)
        summary[fate.action.value] += 1
        if fate.action is RecoveryAction.EXPIRE:
            await ledger.expire(task)
        elif fate.action is RecoveryAction.REQUEUE:
            await ledger.requeue(task, "recovered at start-up: never reached the provider")
        elif fate.reclaim is not None:
            await ledger.reclaim(task, fate.reclaim)
        elif not await adopt(task):
            # Its provider no longer serves the model: the job it holds
            # there is out of reach, and no other provider may poll it.
            why = f"recovered at start-up: its lane api:{task.account} is gone"
            await ledger.requeue(task, why, forget_remote=True)
    log.info(
        "start-up reconciliation: %d resumed polling, %d re-queued, %d web stale, %d expired",
        summary["resume"],
        summary["requeue"],
        summary["stale"],
        summary["expire"],
    )
    return summary
