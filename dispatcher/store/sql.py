"""SQL text shared by the SQLite and PostgreSQL backends.

Both speak the same SQL for what they share; where the dialects differ
(placeholders, booleans, row ids) each backend passes its own piece in.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from dispatcher.models import Account
from dispatcher.store.rows import TASK_COLUMNS

COLUMNS = ", ".join(TASK_COLUMNS)
SELECT_TASK = f"SELECT {COLUMNS} FROM tasks"
ID_TABLES = frozenset({"tasks", "jobs"})

# A job's state from its tasks, as `states.job_state` decides it, for listing
# jobs by state in SQL (a test checks that the two agree).
JOB_STATE_SQL = """CASE
    WHEN c.total IS NULL OR c.active > 0 THEN 'running'
    WHEN c.success = c.total THEN 'success'
    WHEN c.failed = c.total THEN 'failed'
    WHEN c.canceled = c.total THEN 'canceled'
    ELSE 'partial' END"""
JOB_COUNTS_SQL = """SELECT job_id, COUNT(*) AS total,
    SUM(CASE WHEN state IN ('pending', 'running') THEN 1 ELSE 0 END) AS active,
    SUM(CASE WHEN state = 'success' THEN 1 ELSE 0 END) AS success,
    SUM(CASE WHEN state = 'failed' THEN 1 ELSE 0 END) AS failed,
    SUM(CASE WHEN state = 'canceled' THEN 1 ELSE 0 END) AS canceled
    FROM tasks WHERE job_id IS NOT NULL GROUP BY job_id"""


def like_pattern(text: str, *, in_json: bool = False, ascii_json: bool = False) -> str:
    """A LIKE pattern finding `text` anywhere; `in_json` for a column of JSON text.

    Params are stored as UTF-8 JSON; rows written by earlier versions hold
    ASCII JSON, where a prompt's "é" is "\u00e9" (`ascii_json` finds those).
    """
    needle = json.dumps(text, ensure_ascii=ascii_json)[1:-1] if in_json else text
    needle = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{needle}%"


def insert_sql(row: Mapping[str, Any], mark: str, returning: str) -> str:
    """INSERT of one row's columns, with this dialect's placeholder."""
    return _insert_sql(tuple(row), mark, returning)


# Every task row has the same columns: a job of 2,000 tasks built the same
# statement 2,000 times.
@functools.lru_cache(maxsize=32)
def _insert_sql(columns: tuple[str, ...], mark: str, returning: str) -> str:
    marks = ", ".join(mark for _ in columns)
    return f"INSERT INTO tasks ({', '.join(columns)}) VALUES ({marks}) RETURNING {returning}"


def set_clause(columns: Mapping[str, Any], mark: str) -> str:
    return ", ".join(f"{name} = {mark}" for name in columns)


# -- several hosts: statements both dialects share (`?` marks; see `pg_marks`) ---

# The lease of a free, lapsed or dead host's account goes to `host`, with the
# next token; a row that stays (another live holder) answers nothing.
LEASE_ACQUIRE = """INSERT INTO leases (account, host, token, expires_at) VALUES (?, ?, 1, ?)
    ON CONFLICT (account) DO UPDATE SET host = excluded.host, token = leases.token + 1,
        expires_at = excluded.expires_at
    WHERE leases.host IS NULL OR leases.host = excluded.host OR leases.expires_at <= ?
        OR leases.host IN (SELECT id FROM hosts WHERE dead_at IS NOT NULL)
    RETURNING account, host, token, expires_at"""
LEASE_OWNER = "SELECT account, host, token, expires_at FROM leases WHERE account = ?"
LEASE_RENEW = """UPDATE leases SET expires_at = ? WHERE account = ? AND host = ? AND token = ?
    RETURNING account, host, token, expires_at"""
LEASE_RELEASE = "UPDATE leases SET host = NULL WHERE account = ? AND host = ? AND token = ?"
LEASES = (
    "SELECT account, host, token, expires_at FROM leases WHERE host IS NOT NULL ORDER BY account"
)
FENCE = " AND EXISTS (SELECT 1 FROM leases WHERE account = ? AND token = ? AND host IS NOT NULL)"
QUOTA = " AND (SELECT COUNT(*) FROM tasks AS r WHERE r.state = 'running' AND r.owner = ?) < ?"
# A provider's day (issue 30): what it spent since 00:00 UTC (finished tasks'
# cost, running tasks' estimate: reserved) plus the candidate's estimate stays
# within the budget (`pricing.fits_budget`; args: provider, since, limit).
SPENT = """SELECT COALESCE(SUM(COALESCE(b.cost, b.cost_estimate, 0)), 0) FROM tasks AS b
    WHERE b.owner = ? AND b.started_at >= ? AND (b.state = 'running' OR b.cost IS NOT NULL)"""
BUDGET = f" AND COALESCE(c.cost_estimate, 0) + ({SPENT}) <= ? + 1e-9"

# A web account's generations since its allowance's reset (args: owner, since,
# owner, since): the attempts it started that ended, except those put back
# uncharged (a usage cap met, a login wall: error kind 'requeued'), plus the
# one it runs now. Both by index (`attempts_owner`, `tasks_spend`).
GENERATIONS = """SELECT (SELECT COUNT(*) FROM attempts WHERE owner = ? AND started_at >= ?
        AND (error_kind IS NULL OR error_kind <> 'requeued'))
    + (SELECT COUNT(*) FROM tasks WHERE owner = ? AND started_at >= ? AND state = 'running')"""


def cheapest_ready_sql(queue_count: int) -> str:
    """The smallest estimated cost among the queues' ready pending tasks (args:
    queues, now): what a budget with less room than that stops."""
    marks = ", ".join("?" for _ in range(queue_count))
    return (
        "SELECT MIN(COALESCE(cost_estimate, 0)) FROM tasks WHERE state = 'pending' "
        f"AND queue IN ({marks}) AND not_before <= ?"
    )


# Whether any task waits with fallback queues (the partial index `tasks_fallback`).
FALLBACKS_WAITING = (
    "SELECT 1 FROM tasks {hint} WHERE state = 'pending' AND alt_queues IS NOT NULL LIMIT 1"
)


def ranked_sql(queue_count: int, *, hint: str = "") -> str:
    """Whether a pending task of the queues has a priority or a deadline (args:
    queues); the partial index `tasks_ranked` answers it without a scan.
    SQLite, without statistics, prefers the queue index and scans the whole
    queue: `hint` is its "INDEXED BY tasks_ranked"."""
    marks = ", ".join("?" for _ in range(queue_count))
    return (
        f"SELECT 1 FROM tasks {hint} WHERE state = 'pending' "
        f"AND (priority <> 0 OR deadline IS NOT NULL) AND queue IN ({marks}) LIMIT 1"
    )


# The order a queue is served in (`pricing.order_key`): higher priority,
# raised one level per aging step waited (args: now, step), then the earliest
# deadline (none last), then FIFO.
CLAIM_ORDER = (
    "c.priority + {levels} DESC, CASE WHEN c.deadline IS NULL THEN 1 ELSE 0 END, c.deadline, c.seq"
)
# Whole aging steps waited, never negative: SQLite's CAST truncates (= floor
# once clamped at 0), PostgreSQL's rounds, hence its FLOOR.
AGING_SQLITE = "CAST(MAX(0, (? - c.created_at) / ?) AS INTEGER)"
AGING_POSTGRES = "CAST(FLOOR(GREATEST(0, (? - c.created_at) / ?)) AS INTEGER)"

HOST_REGISTER = """INSERT INTO hosts (id, url, started_at, heartbeat_at, dead_at)
    VALUES (?, ?, ?, ?, NULL)
    ON CONFLICT (id) DO UPDATE SET url = excluded.url, started_at = excluded.started_at,
        heartbeat_at = excluded.heartbeat_at, dead_at = NULL"""
HOST_BEAT = "UPDATE hosts SET heartbeat_at = ? WHERE id = ? AND dead_at IS NULL RETURNING id"
HOSTS = "SELECT id, url, started_at, heartbeat_at, dead_at FROM hosts ORDER BY id"
HOSTS_STALE = (
    "SELECT id, url, started_at, heartbeat_at, dead_at FROM hosts "
    "WHERE dead_at IS NULL AND heartbeat_at < ? ORDER BY id"
)
# Compare-and-set: of two hosts declaring a third dead, one does.
HOST_DEAD = """UPDATE hosts SET dead_at = ? WHERE id = ? AND dead_at IS NULL AND heartbeat_at < ?
    RETURNING id"""

# One host wins the telling of each finish of a job: the finish is named by
# the job's latest `finished_at` (a retry's new finish has another).
JOB_FINISH_TELL = """UPDATE jobs SET finish_told_at = ?
    WHERE id = ? AND (finish_told_at IS NULL OR finish_told_at <> ?) RETURNING id"""

# One host wins the telling of a provider's reached budget for a day.
BUDGET_TELL = """INSERT INTO budget_told (provider, until, told_at) VALUES (?, ?, ?)
    ON CONFLICT (provider, until) DO NOTHING RETURNING provider"""

GATE_SET = """INSERT INTO gates (provider, not_before) VALUES (?, ?)
    ON CONFLICT (provider) DO UPDATE SET not_before = excluded.not_before
    WHERE excluded.not_before > gates.not_before"""
GATE_GET = "SELECT not_before FROM gates WHERE provider = ?"

TWIN = (
    f"{SELECT_TASK} WHERE fingerprint = ? AND created_at >= ? "
    "AND state NOT IN ('failed', 'canceled') ORDER BY seq DESC LIMIT 1"
)


def pg_marks(sql: str) -> str:
    """The statement with PostgreSQL's placeholders (none of ours holds a literal `?`)."""
    return sql.replace("%", "%%").replace("?", "%s")


def claim_sql(
    queue_count: int,
    columns: Mapping[str, Any],
    *,
    fenced: bool,
    quota: bool,
    lock: str,
    budget: bool = False,
    aging: str = AGING_SQLITE,
    ranked: bool = True,
    fallbacks: bool = False,
    prefer: int = 0,
    position: str = "instr",
) -> str:
    """Find and take the first ready pending task of the queues in one statement.

    `lock` is "FOR UPDATE SKIP LOCKED" on PostgreSQL (hosts claiming at once
    pass over each other's rows) and "" on SQLite (one writer at a time).
    `aging` is the dialect's whole aging steps waited (`AGING_SQLITE`, `AGING_POSTGRES`).
    Args: values, queues, [fallback patterns, [deferred_args]], now, [fence],
    [quota], [budget], [now, aging step]. With `fallbacks`, `prefer` queues
    are left their fallback tasks (`_deferred`).
    Without `ranked` (no pending task of the queues has a priority or a
    deadline: `ranked_sql`) the order is plain FIFO, which the queue index
    serves without sorting the whole queue.
    """
    guard = claim_guard(fenced=fenced, quota=quota, budget=budget)
    pick = claim_pick(
        queue_count,
        guard,
        order=CLAIM_ORDER.format(levels=aging) if ranked else "c.seq",
        fallbacks=fallbacks,
        lock=lock,
        prefer=prefer,
        position=position,
    )
    return (
        f"UPDATE tasks SET {set_clause(columns, '?')} WHERE state = 'pending' "
        f"AND seq = ({pick}) RETURNING {COLUMNS}"
    )


def claim_guard(*, fenced: bool, quota: bool, budget: bool) -> str:
    """What a claim must still hold: the account's lease (args: account,
    token), room in the provider's quota (owner, limit), room in its daily
    budget (provider, since, limit)."""
    return (FENCE if fenced else "") + (QUOTA if quota else "") + (BUDGET if budget else "")


def claim_pick(
    queue_count: int,
    guard: str,
    *,
    order: str,
    fallbacks: bool,
    lock: str,
    gate: str = "",
    prefer: int = 0,
    position: str = "instr",
) -> str:
    """The SELECT of the claimed task's seq (args: queues, [fallback patterns,
    [deferred_args]], now, [guard's]; [now, aging step] when `order` ages)."""
    marks = ", ".join("?" for _ in range(queue_count))
    where = f"c.queue IN ({marks})"
    if fallbacks:
        # Also the tasks waiting in these queues as a fallback (args: one
        # `like_pattern("|queue|")` per queue, after the queues).
        alts = " OR ".join("c.alt_queues LIKE ? ESCAPE '\\'" for _ in range(queue_count))
        defer = _deferred(queue_count, prefer, position) if prefer else ""
        where = f"({where} OR (c.alt_queues IS NOT NULL AND ({alts}){defer}))"
    return (
        f"SELECT c.seq FROM tasks AS c WHERE {gate}c.state = 'pending' AND {where} "
        f"AND c.not_before <= ?{guard} ORDER BY {order} LIMIT 1 {lock}"
    )


def claim_sql_gated(
    queue_count: int,
    columns: Mapping[str, Any],
    *,
    fenced: bool,
    quota: bool,
    lock: str,
    budget: bool = False,
    aging: str = AGING_POSTGRES,
    prefer: int = 0,
    position: str = "strpos",
    only_if: str = "",
) -> str:
    """`claim_sql` in one statement whatever the queues hold: the looks that
    pick its order (`ranked_sql`, `FALLBACKS_WAITING`) are made in the same
    statement, each of three picks running only under its own (PostgreSQL,
    where a look is a round trip; its planner evaluates each uncorrelated
    EXISTS once, and COALESCE stops at the first pick that finds a task).
    Args, per pick in this order: [ranked look: queues], its `claim_sql`
    args but the values: ranked (fallbacks too), FIFO with fallbacks, FIFO.
    The two picks among fallbacks leave `prefer` queues theirs (`_deferred`).
    `only_if`: a condition without marks, checked before any pick.
    """
    guard = claim_guard(fenced=fenced, quota=quota, budget=budget)
    ranked = f"EXISTS ({ranked_sql(queue_count)})"
    waiting = f"EXISTS ({FALLBACKS_WAITING.format(hint='')})"
    ordered = CLAIM_ORDER.format(levels=aging)
    picks = [
        claim_pick(
            queue_count,
            guard,
            order=ordered,
            fallbacks=True,
            lock=lock,
            gate=f"{ranked} AND ",
            prefer=prefer,
            position=position,
        ),
        claim_pick(
            queue_count,
            guard,
            order="c.seq",
            fallbacks=True,
            lock=lock,
            gate=f"NOT {ranked} AND {waiting} AND ",
            prefer=prefer,
            position=position,
        ),
        claim_pick(
            queue_count,
            guard,
            order="c.seq",
            fallbacks=False,
            lock=lock,
            gate=f"NOT {ranked} AND NOT {waiting} AND ",
        ),
    ]
    coalesce = ", ".join(f"({pick})" for pick in picks)
    condition = f"{only_if} AND " if only_if else ""
    return (
        f"UPDATE tasks SET {set_clause(columns, '?')} WHERE {condition}state = 'pending' "
        f"AND seq = COALESCE({coalesce}) RETURNING {COLUMNS}"
    )


def _deferred(queue_count: int, prefer: int, position: str) -> str:
    """What a lane leaves to the free lanes of a task's earlier choices (issue
    30): a fallback whose first choice is a `prefer` queue, or that lists a
    `prefer` queue before every one of the claiming lane's queues it lists.
    Args, after the LIKE patterns: the prefer queues; then per prefer queue
    its "|queue|" and, per lane queue, that queue's, the prefer one's and
    that queue's again. `position` is the dialect's substring position
    (SQLite `instr`, PostgreSQL `strpos`: 0 when absent, else 1-based)."""
    marks = ", ".join("?" for _ in range(prefer))
    at = f"{position}(c.alt_queues, ?)"
    before_all = " AND ".join(f"({at} = 0 OR {at} < {at})" for _ in range(queue_count))
    earlier = " OR ".join(f"({at} > 0 AND {before_all})" for _ in range(prefer))
    return f" AND c.queue NOT IN ({marks}) AND NOT ({earlier})"


def deferred_args(queues: Sequence[str], prefer: Sequence[str]) -> list[str]:
    """The arguments of `_deferred`, in its order."""
    args = list(prefer)
    for early in prefer:
        args.append(f"|{early}|")
        for queue in queues:
            args += [f"|{queue}|", f"|{early}|", f"|{queue}|"]
    return args


def update_sql(
    columns: Mapping[str, Any], *, attempt: bool, unless_cancel: bool, fenced: bool
) -> str:
    """The compare-and-set of one task (args: values, id, state[, attempt][, fence])."""
    sql = f"UPDATE tasks SET {set_clause(columns, '?')} WHERE id = ? AND state = ?"
    if attempt:
        sql += " AND attempt = ?"
    if unless_cancel:
        sql += " AND cancel_requested = 0"
    if fenced:
        sql += FENCE
    return f"{sql} RETURNING {COLUMNS}"


def list_tasks_where(
    states: Sequence[str],
    model: str | None,
    job_id: str | None,
    text: str | None,
    before_seq: int | None,
    ref: str | None = None,
    after_seq: int | None = None,
) -> tuple[str, list[Any]]:
    where: list[str] = []
    args: list[Any] = []
    if states:
        where.append(f"state IN ({', '.join('?' for _ in states)})")
        args += list(states)
    if model is not None:
        where.append("model = ?")
        args.append(model)
    if job_id is not None:
        where.append("job_id = ?")
        args.append(job_id)
    if text:
        where.append(
            "(params LIKE ? ESCAPE '\\' OR params LIKE ? ESCAPE '\\' OR ref LIKE ? ESCAPE '\\')"
        )
        args += [
            like_pattern(text, in_json=True),
            like_pattern(text, in_json=True, ascii_json=True),
            like_pattern(text),
        ]
    if ref:
        where.append("ref LIKE ? ESCAPE '\\'")
        args.append(like_pattern(ref))
    if before_seq is not None:
        where.append("seq < ?")
        args.append(before_seq)
    if after_seq is not None:
        where.append("seq > ?")
        args.append(after_seq)
    return (f" WHERE {' AND '.join(where)}" if where else ""), args


# A task late for its deadline (args: now; a huge now counts only the finished ones).
LATE_SQL = """SUM(CASE WHEN deadline IS NOT NULL AND state NOT IN ('failed', 'canceled')
    AND COALESCE(finished_at, ?) > deadline THEN 1 ELSE 0 END)"""

# A job's tasks per model and state: what a job's light view sums up.
JOB_MODEL_COUNTS = (
    "SELECT model, state, COUNT(*) AS n FROM tasks WHERE job_id = ? GROUP BY model, state"
)


def list_jobs_sql(
    states: Sequence[str], text: str | None, before_seq: int | None, seq_column: str
) -> tuple[str, list[Any]]:
    """Jobs newest first (`seq_column`: SQLite's rowid, PostgreSQL's seq); LIMIT ? follows."""
    where: list[str] = []
    args: list[Any] = []
    join = ""
    if states:
        join = f" LEFT JOIN ({JOB_COUNTS_SQL}) AS c ON c.job_id = j.id"
        where.append(f"{JOB_STATE_SQL} IN ({', '.join('?' for _ in states)})")
        args += list(states)
    if text:
        where.append("j.name LIKE ? ESCAPE '\\'")
        args.append(like_pattern(text))
    if before_seq is not None:
        where.append(f"j.{seq_column} < ?")
        args.append(before_seq)
    sql = f"SELECT j.id, j.name, j.created_at, j.{seq_column} FROM jobs AS j{join}"
    if where:
        sql += f" WHERE {' AND '.join(where)}"
    return f"{sql} ORDER BY j.{seq_column} DESC LIMIT ?", args


# -- statements both backends run as they are -------------------------------------
# What finished tasks cost per provider (lane owner), for /metrics.
COST_BY_PROVIDER = (
    "SELECT owner, SUM(cost) AS usd FROM tasks WHERE cost IS NOT NULL AND owner IS NOT NULL "
    "GROUP BY owner"
)
STALE_RUNNING = (
    f"{SELECT_TASK} WHERE state = 'running' "
    "AND COALESCE(heartbeat_at, started_at, created_at) < ? ORDER BY seq"
)
RECENT_DURATIONS = (
    "SELECT finished_at - started_at AS d FROM tasks WHERE model = ? AND state = 'success' "
    "AND from_cache = 0 AND started_at IS NOT NULL AND finished_at IS NOT NULL "
    "ORDER BY finished_at DESC LIMIT ?"
)
ACCOUNTS = (
    "SELECT name, kind, enabled, reason, needs_attention, updated_at, cooldown_until FROM accounts"
)
ACCOUNT_UPSERT = (
    "INSERT INTO accounts (name, kind, enabled, reason, needs_attention, updated_at, "
    "cooldown_until) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
    "kind = excluded.kind, enabled = excluded.enabled, reason = excluded.reason, "
    "needs_attention = excluded.needs_attention, updated_at = excluded.updated_at, "
    "cooldown_until = excluded.cooldown_until"
)
WEB_ACCOUNTS = "SELECT name, models FROM web_accounts ORDER BY name"
WEB_ACCOUNT_PUT = (
    "INSERT INTO web_accounts (name, models, added_at) VALUES (?, ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET models = excluded.models"
)


def account_args(account: Account) -> tuple[Any, ...]:
    return (
        account.name,
        account.kind.value,
        int(account.enabled),
        account.reason,
        int(account.needs_attention),
        account.updated_at,
        account.cooldown_until,
    )
