"""A submitted task inserted running, when its lane's claim would take it (PostgreSQL).

A submit to an API lane with a free slot carries the lane's claim
(`tasks.submitclaim`): the locks, the insert and the claim, one pipeline.
When this host knows that no task waits anywhere (`ClaimView.nothing_pending`:
the last claim read so, nothing heard pending since), that claim would take
the new task itself. Then the task is inserted running, the claim's columns
written by the insert: two statements, not three, and the row written once,
not twice (each write of a task row adds an entry to each of its indexes).
Benchmark 6 (issue 31): every instant task of a drain took this path.

The statement checks on the server what the claim would have found, after
the locks (its snapshot sees every claim committed before it): no other
task of the lane's queues ready, none waiting as a fallback anywhere, the
provider's quota with room. If one fails (another host's task not heard
yet, the quota filled by another host), the same statement inserts the task
pending, as the insert alone would, and the scheduler's round claims.
"""

from __future__ import annotations

from dispatcher.models import State, Task
from dispatcher.store.base import NextClaim
from dispatcher.store.pgplaces import placed_insert_unless_twin
from dispatcher.store.rows import task_to_row
from dispatcher.store.sql import FALLBACKS_WAITING, QUOTA, TWIN, pg_marks
from dispatcher.store.taskwrites import Statement

# Whether the claim would take the new task: no other task of the lane's
# queues ready (the claim's FIFO and ranked picks), none waiting as a
# fallback (its fallback pick; rare, so any one anywhere sends the claim
# its own way), room in the quota when one guards the provider.
_RUNS = (
    "NOT EXISTS (SELECT 1 FROM tasks AS c WHERE c.state = 'pending' "
    "AND c.queue IN ({queues}) AND c.not_before <= ?) "
    f"AND NOT EXISTS ({FALLBACKS_WAITING.format(hint='')}){{quota}}"
)


def runs_at_once(task: Task, claim: NextClaim) -> bool:
    """Whether `claim`, sent with `task`'s insert, would take `task` when no
    other task waits: a claim carried by a submit (no lease to prove, no
    budget, no queue to defer to: `scheduling.withend`) from a lane serving
    the task's queue, the task ready now."""
    return (
        task.state is State.PENDING
        and task.queue in claim.queues
        and task.not_before <= claim.now
        and not task.cancel_requested
        and claim.fence is None
        and claim.budget is None
        and not claim.prefer
    )


def insert_running(task: Task, created_since: float, claim: NextClaim) -> tuple[Statement, Task]:
    """The statement inserting `task` (unless a twin exists:
    `placed_insert_unless_twin`, its answer) running as `claim` would write
    it when the server finds the claim would take it, else pending; and the
    task as it runs then (its statement's label: "WITH claim_now AS"). Also
    answered, what the claim would have read for `ClaimView`: `after_any`,
    `after_running` (NULL without a quota; the new task not among them)."""
    running = task.replace(state=State.RUNNING, **claim.changes)
    waiting, ran = task_to_row(task), task_to_row(running)
    picks: list[str] = []
    values: list[object] = []
    for name, value in waiting.items():
        if ran[name] == value:
            picks.append("?")
            values.append(value)
        else:
            # Each branch a value of its own type (a NULL beside it takes it).
            picks.append("CASE WHEN claim_now.run THEN ? ELSE ? END")
            values += [ran[name], value]
    quota = claim.quota
    queue_marks = ", ".join("?" for _ in claim.queues)
    runs = _RUNS.format(queues=queue_marks, quota=QUOTA if quota is not None else "")
    running_ids = (
        "NULL"
        if quota is None
        else "ARRAY(SELECT id FROM tasks WHERE state = 'running' AND owner = ?)"
    )
    sql = placed_insert_unless_twin(
        f"INSERT INTO tasks ({', '.join(waiting)}) SELECT {', '.join(picks)} FROM claim_now",
        TWIN,
        first=f"claim_now AS (SELECT {runs} AS run)",
        also=", EXISTS (SELECT 1 FROM tasks WHERE state = 'pending') AS after_any, "
        f"{running_ids} AS after_running",
    )
    args: list[object] = [*claim.queues, claim.now]
    if quota is not None:
        args += [quota.owner, quota.limit]
    args += [task.fingerprint, created_since, *values]
    if quota is not None:
        args.append(quota.owner)
    return Statement(pg_marks(sql), tuple(args)), running
