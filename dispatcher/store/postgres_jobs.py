"""Jobs, the claim's side reads (spend, waiting ranks, fallbacks) and
accounts on PostgreSQL: reads and plain one-statement writes (the store's
own class is `store.postgres.PostgresStore`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dispatcher.models import Account, Job, JobState, JobSummary, State, Task
from dispatcher.store.rows import row_to_account, row_to_task
from dispatcher.store.sql import (
    ACCOUNT_UPSERT,
    ACCOUNTS,
    COST_BY_PROVIDER,
    GENERATIONS,
    JOB_MODEL_COUNTS,
    LATE_SQL,
    SELECT_TASK,
    SPENT,
    WEB_ACCOUNT_PUT,
    WEB_ACCOUNTS,
    account_args,
    cheapest_ready_sql,
    list_jobs_sql,
)
from dispatcher.store.taskwrites import POSTGRESQL, fallbacks_query, ranked_query

Row = dict[str, Any]


class PostgresJobOps:
    async def _query(
        self, sql: str, args: Sequence[Any] = (), *, what: str = "read", marked: bool = False
    ) -> list[Row]:
        raise NotImplementedError

    async def _write1(
        self, sql: str, args: Sequence[Any] = (), *, marked: bool = False
    ) -> list[Row]:
        raise NotImplementedError

    # -- jobs ----------------------------------------------------------------
    async def get_job(self, job_id: str) -> Job | None:
        rows = await self._query(
            "SELECT id, name, created_at, seq FROM jobs WHERE id = ?", (job_id,)
        )
        return _job(rows[0]) if rows else None

    async def job_tasks(self, job_id: str) -> list[Task]:
        rows = await self._query(f"{SELECT_TASK} WHERE job_id = ? ORDER BY seq", (job_id,))
        return [row_to_task(r) for r in rows]

    async def job_counts(self, job_id: str) -> dict[State, int]:
        rows = await self._query(
            "SELECT state, COUNT(*) AS n FROM tasks WHERE job_id = ? GROUP BY state", (job_id,)
        )
        return {State(r["state"]): int(r["n"]) for r in rows}

    async def job_model_counts(self, job_id: str) -> dict[tuple[str, State], int]:
        rows = await self._query(JOB_MODEL_COUNTS, (job_id,))
        return {(r["model"], State(r["state"])): int(r["n"]) for r in rows}

    async def list_jobs(
        self,
        *,
        states: Sequence[JobState] = (),
        text: str | None = None,
        before_seq: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        sql, args = list_jobs_sql(
            [JobState(x).value for x in states], text, before_seq, seq_column="seq"
        )
        return [_job(r) for r in await self._query(sql, (*args, limit))]

    async def job_summaries(
        self, job_ids: Sequence[str], now: float | None = None
    ) -> dict[str, JobSummary]:
        summaries = {job_id: JobSummary(counts={}) for job_id in job_ids}
        if not summaries:
            return summaries
        rows = await self._query(
            "SELECT job_id, state, COUNT(*) AS n, SUM(from_cache) AS cached, "
            f"MAX(finished_at) AS finished, SUM(cost) AS usd, {LATE_SQL} AS late "
            "FROM tasks WHERE job_id = ANY(?) GROUP BY job_id, state",
            (-1.0 if now is None else now, list(summaries)),
        )
        for r in rows:
            summary = summaries[r["job_id"]]
            summary.counts[State(r["state"])] = int(r["n"])
            summary.from_cache += int(r["cached"] or 0)
            summary.cost_usd += float(r["usd"] or 0.0)
            summary.late += int(r["late"] or 0)
            finished = r["finished"]
            if finished is not None and (
                summary.last_finished_at is None or finished > summary.last_finished_at
            ):
                summary.last_finished_at = float(finished)
        return summaries

    async def cheapest_ready(self, queues: Sequence[str], now: float) -> float | None:
        if not queues:
            return None
        rows = await self._query(cheapest_ready_sql(len(queues)), (*queues, now))
        value = next(iter(rows[0].values())) if rows else None
        return None if value is None else float(value)

    async def spent_since(self, provider: str, since: float) -> float:
        rows = await self._query(SPENT, (provider, since))
        return float(next(iter(rows[0].values())) or 0.0)

    async def ranked_waiting(self, queues: Sequence[str]) -> bool:
        found = ranked_query(POSTGRESQL, queues)
        return bool(queues) and bool(await self._query(found.sql, found.args, marked=True))

    async def fallbacks_waiting(self) -> bool:
        found = fallbacks_query(POSTGRESQL)
        return bool(await self._query(found.sql, found.args, marked=True))

    async def generations_since(self, owner: str, since: float) -> int:
        rows = await self._query(GENERATIONS, (owner, since, owner, since))
        return int(next(iter(rows[0].values())) or 0)

    async def cost_by_provider(self) -> dict[str, float]:
        rows = await self._query(COST_BY_PROVIDER)
        return {r["owner"]: float(r["usd"] or 0.0) for r in rows}

    # -- accounts ------------------------------------------------------------
    async def get_accounts(self) -> dict[str, Account]:
        rows = await self._query(ACCOUNTS)
        return {r["name"]: row_to_account(r) for r in rows}

    async def upsert_account(self, account: Account) -> None:
        await self._write1(ACCOUNT_UPSERT, account_args(account))

    async def delete_account(self, name: str) -> None:
        await self._write1("DELETE FROM accounts WHERE name = ?", (name,))

    async def get_web_accounts(self) -> dict[str, tuple[str, ...]]:
        rows = await self._query(WEB_ACCOUNTS)
        return {r["name"]: tuple(json.loads(r["models"])) for r in rows}

    async def put_web_account(self, name: str, models: Sequence[str], added_at: float) -> None:
        await self._write1(WEB_ACCOUNT_PUT, (name, json.dumps(sorted(models)), added_at))

    async def delete_web_account(self, name: str) -> None:
        await self._write1("DELETE FROM web_accounts WHERE name = ?", (name,))


def _job(row: Row) -> Job:
    return Job(id=row["id"], name=row["name"], created_at=row["created_at"], seq=row["seq"])
