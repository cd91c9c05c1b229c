"""Recovery: the fate of each task a previous run, or a dead host, left `running`.

`decide` is pure (one task, the time, the bounds: what happens to it) and
`plan` decides for a whole list; `recover` applies the decisions through the
ledger and counts them. The rules per kind are `decisions.plan_recovery`'s,
the same at start-up (a host's own tasks) and for a host declared dead (its
tasks, recovered by another host): an API job with a remote id is resumed by
polling that id, never submitted again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass

from dispatcher.models import Task
from dispatcher.scheduling.decisions import Reclaim, RecoveryAction, plan_recovery, reclaim_plan
from dispatcher.tasks.ledger import Ledger

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


def plan(
    running: Iterable[Task],
    *,
    models: Collection[str],
    now: float,
    expire_after_s: float,
    retry_delay_s: float,
) -> list[tuple[Task, Recovery]]:
    """Each loaded model's task with its fate; tasks of models not loaded now
    stay as they are until their model is back."""
    return [
        (task, decide(task, now=now, expire_after_s=expire_after_s, retry_delay_s=retry_delay_s))
        for task in running
        if task.model in models
    ]


async def recover(
    running: Iterable[Task],
    *,
    ledger: Ledger,
    models: Collection[str],
    adopt: Callable[[Task], Awaitable[bool]],
    now: float,
    expire_after_s: float,
    retry_delay_s: float,
    what: str = "start-up reconciliation",
    why: str = "recovered at start-up",
) -> dict[str, int]:
    """Apply each loaded model's task's fate; log one line; the counts by action.

    `adopt` hands an API task with a remote id to its lane to resume polling;
    it answers False when that lane is gone. The writes are not fenced: the
    lease a web task ran under belongs to a run that is over (its token may
    have moved on since), and each write is still a compare-and-set on the
    task's state and attempt.
    """
    summary = {action.value: 0 for action in RecoveryAction}
    fates = plan(
        running, models=models, now=now, expire_after_s=expire_after_s, retry_delay_s=retry_delay_s
    )
    for task, fate in fates:
        summary[fate.action.value] += 1
        if fate.action is RecoveryAction.EXPIRE:
            await ledger.expire(task, fenced=False)
        elif fate.action is RecoveryAction.REQUEUE:
            await ledger.requeue(task, f"{why}: never reached the provider", fenced=False)
        elif fate.reclaim is not None:
            await ledger.reclaim(task, fate.reclaim, fenced=False)
        elif not await adopt(task):
            # Its provider is not served here: the job it holds there is
            # out of reach, and no other provider may poll it.
            gone = f"{why}: its lane api:{task.owner} is not served here"
            await ledger.requeue(task, gone, forget_remote=True, fenced=False)
    log.info(
        "%s: %d resumed polling, %d re-queued, %d web stale, %d expired",
        what,
        summary["resume"],
        summary["requeue"],
        summary["stale"],
        summary["expire"],
    )
    return summary
