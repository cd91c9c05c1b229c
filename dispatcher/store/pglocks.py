"""The advisory locks PostgreSQL's hosts take turns by.

One 64-bit key space per database: the migrations' key, and per-subject
locks hashed from a prefixed text by `hashtextextended` ("dedup:<fingerprint>"
for a de-duplicating insert, "quota:<provider>" for a claim under a quota or
a budget). Each is transaction-scoped: released at the commit, or the
rollback, of the transaction that took it.
"""

from __future__ import annotations

from dispatcher.models import Task
from dispatcher.store.base import NextClaim
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
