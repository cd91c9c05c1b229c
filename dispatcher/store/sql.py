"""SQL text shared by the SQLite and PostgreSQL backends.

Both speak the same SQL for what they share; where the dialects differ
(placeholders, booleans, row ids) each backend passes its own piece in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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
    marks = ", ".join(mark for _ in row)
    return f"INSERT INTO tasks ({', '.join(row)}) VALUES ({marks}) RETURNING {returning}"


def set_clause(columns: Mapping[str, Any], mark: str) -> str:
    return ", ".join(f"{name} = {mark}" for name in columns)
