"""The narrow interface every store backend implements. No SQL outside `store/`.

Every task write is a compare-and-set: `update_task` applies its changes only
while the row still has the expected state (and attempt, when given) and
returns None when the row has moved on, so a late result can never overwrite
a newer decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from dispatcher.models import Account, Attempt, CacheEntry, Job, JobState, JobSummary, State, Task


class Store(Protocol):
    @property
    def writes(self) -> Mapping[str, int]:
        """Rows written per recent task id: transitions and heartbeats only (see tests)."""

    def migrate(self) -> None: ...

    def close(self) -> None: ...

    # -- tasks -----------------------------------------------------------
    def insert_tasks(self, tasks: Sequence[Task], job: Job | None = None) -> list[Task]:
        """Insert tasks (and their job) atomically; returns them with `seq` set."""

    def get_task(self, task_id: str) -> Task | None: ...

    def update_task(
        self,
        task_id: str,
        *,
        expect_state: State,
        expect_attempt: int | None = None,
        changes: Mapping[str, Any],
        unless_cancel_requested: bool = False,
        ended: Attempt | None = None,
    ) -> Task | None:
        """CAS: apply `changes` only if state (and attempt) still match, and, with
        `unless_cancel_requested`, only if nobody has asked to cancel the task.
        `ended` is written to the attempt history in the same transaction, only
        when the change applies."""

    def task_attempts(self, task_id: str) -> list[Attempt]:
        """The task's ended attempts, oldest first."""

    def list_tasks(
        self,
        *,
        states: Sequence[State] = (),
        model: str | None = None,
        job_id: str | None = None,
        text: str | None = None,
        before_seq: int | None = None,
        limit: int = 50,
    ) -> list[Task]:
        """Newest first; `text` is found in the params (the prompt) or the ref;
        `before_seq` pages on from a previous answer's last task."""

    def ids_with_prefix(self, table: str, prefix: str, limit: int = 10) -> list[str]:
        """Ids of `tasks` or `jobs` starting with `prefix` (at most `limit`)."""

    def claim_next(
        self, lane_groups: Sequence[str], now: float, changes: Mapping[str, Any]
    ) -> Task | None:
        """Oldest pending task of these groups whose `not_before` has passed, moved
        to running with `changes` in the same atomic step (row-locked on PostgreSQL)."""

    def tasks_in_state(self, state: State, limit: int | None = None) -> list[Task]: ...

    def stale_running(self, heartbeat_before: float) -> list[Task]:
        """Running tasks whose last heartbeat (or start) is older than the bound."""

    def count_ahead(self, lane_group: str, seq: int) -> int:
        """Pending tasks of the group inserted before `seq`."""

    def queued_counts(self) -> dict[str, int]:
        """Pending tasks per lane group."""

    def state_counts(self) -> dict[tuple[str, str], int]:
        """Tasks per (model, state), for metrics."""

    def recent_durations(self, model: str, limit: int = 20) -> list[float]:
        """Run times (started to finished) of the model's latest successes."""

    def find_by_fingerprint(self, fingerprint: str, created_since: float) -> Task | None:
        """Newest task with this fingerprint created since then, not failed or canceled."""

    # -- jobs --------------------------------------------------------------
    def get_job(self, job_id: str) -> Job | None: ...

    def job_tasks(self, job_id: str) -> list[Task]: ...

    def job_counts(self, job_id: str) -> dict[State, int]: ...

    def list_jobs(
        self,
        *,
        states: Sequence[JobState] = (),
        text: str | None = None,
        before_seq: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Newest first; `text` is found in the name; paged like `list_tasks`."""

    def job_summaries(self, job_ids: Sequence[str]) -> dict[str, JobSummary]:
        """Counts per state, cache answers and the last finish, for each job."""

    # -- accounts (web accounts and API providers) ---------------------------
    def get_accounts(self) -> dict[str, Account]: ...

    def upsert_account(self, account: Account) -> None: ...

    def delete_account(self, name: str) -> None: ...

    # -- web accounts added at run time ----------------------------------------
    def get_web_accounts(self) -> dict[str, tuple[str, ...]]:
        """Account name -> the models it serves, for accounts added at run time."""

    def put_web_account(self, name: str, models: Sequence[str], added_at: float) -> None: ...

    def delete_web_account(self, name: str) -> None: ...

    # -- result cache index ----------------------------------------------------
    def cache_get(self, fingerprint: str) -> CacheEntry | None: ...

    def cache_put(self, entry: CacheEntry) -> None: ...

    def cache_touch(self, fingerprint: str, last_used_at: float) -> None: ...

    def cache_delete(self, fingerprint: str) -> None: ...

    def cache_entries(self) -> list[CacheEntry]: ...
