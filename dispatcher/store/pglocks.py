"""The advisory locks PostgreSQL's hosts take turns by.

One 64-bit key space per database: the migrations' key, and per-subject
locks hashed from a prefixed text by `hashtextextended` ("dedup:<fingerprint>"
for a de-duplicating insert, "quota:<provider>" for a claim under a quota or
a budget). Each is transaction-scoped: released at the commit, or the
rollback, of the transaction that took it.
"""

from __future__ import annotations

from dispatcher.models import State, Task
from dispatcher.store.base import NextClaim, TaskWrite
from dispatcher.store.taskwrites import Statement

MIGRATION_LOCK = 0x6469737061746368  # "dispatch"


def claim_lock(claim: NextClaim) -> str | None:
    """The advisory lock a claim takes first, under a provider's quota or
    budget (else None). The count of running tasks (or the day's spend) and
    the claim must be one step across hosts: claims under one provider's
    quota or budget take turns. The claim statement starts after the lock,
    so it counts every claim committed before: no overspend by a race. Sent
    as one pipeline, the lock is held for the server's work and for the gaps
    between the pipeline's statements: psycopg sends each as it is queued,
    and a client preempted between two keeps the lock (three hosts sharing
    two cores in `bench hosts`: ~0.4 server processes at any moment wait so
    for their client, inside a transaction)."""
    quota, budget = claim.quota, claim.budget
    if quota is None and budget is None:
        return None
    provider = quota.owner if quota is not None else budget.provider if budget else ""
    return f"quota:{provider}"


def xact_lock(*names: str) -> Statement:
    """A transaction's advisory locks on `names`, in their order (a plain
    SELECT: a statement of its own in a pipeline, or `first` in an end
    write's WITH)."""
    locks = ", ".join("pg_advisory_xact_lock(hashtextextended(%s, 0))" for _ in names)
    return Statement(f"SELECT {locks}", names)


def insert_locks(task: Task, also: str | None = None) -> Statement:
    """The statement a de-duplicating insert of `task` sends first: its
    fingerprint's lock, then `also` (a claim's, `claim_lock`) when given.
    Identical submits on two hosts serialise on it: the insert after it
    sees a twin committed before."""
    return xact_lock(f"dedup:{task.fingerprint}", *([also] if also else []))


# The setting an end write sets, for its transaction only, when it took a
# running task of the claim's provider out of running (`slot_freed`).
FREED = "dispatcher.slot_freed"
# What the claim after such an end checks first (`claim_sql_gated`'s `only_if`).
IF_SLOT_FREED = f"current_setting('{FREED}', true) = '1'"


def swaps_slot(write: TaskWrite, claim: NextClaim) -> bool:
    """Whether `claim`, sent after `write` in one transaction, can do without
    its quota's lock (`claim_lock`): the write ends a running task, which
    under the claim's provider frees the very slot the claim takes. Such a
    transaction leaves the provider's running count as it found it, and any
    snapshot counts the same before and after its commit (the task ending or
    the task claimed, never both and never neither), so it cannot push a
    concurrent claim over the quota, nor be pushed by one. Only claims that
    add a running task take turns on the lock. Three hosts draining a
    backlog held it ~2 ms a claim (the end, the claim, the commit, and the
    client's gaps between them): a claim waited ~1 ms for it on average
    (`bench hosts`, pg_stat_statements). Under a budget the claimed task's
    estimate adds to the spend: the lock stays. The write marks the
    transaction only when it applied to a task of that provider
    (`slot_freed`); the claim runs only if marked (`IF_SLOT_FREED`)."""
    state = write.changes.get("state")
    return (
        claim.quota is not None
        and claim.budget is None
        and claim.fence is None
        and write.expect_state is State.RUNNING
        and state is not None
        and State(state) is not State.RUNNING
    )


def slot_freed(owner: str) -> Statement:
    """The SELECT an end write runs over its updated row (`u`): marks the
    transaction (`FREED`) when a task of `owner` left running."""
    return Statement(
        f"SELECT set_config('{FREED}', '1', true) FROM u "
        "WHERE u.owner = %s AND u.state <> 'running'",
        (owner,),
    )
