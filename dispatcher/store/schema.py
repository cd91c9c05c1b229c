"""Versioned schema: migrations are applied in order and never edited once shipped.

`schema.sql` beside this file is the resulting schema written out by hand; a
test applies every migration to an empty database and compares the two, so a
migration that drifts from the documented schema fails CI.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            """CREATE TABLE jobs (
                id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                created_at REAL NOT NULL
            )""",
            """CREATE TABLE tasks (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                id TEXT NOT NULL UNIQUE,
                job_id TEXT REFERENCES jobs(id),
                model TEXT NOT NULL,
                kind TEXT NOT NULL,
                lane_group TEXT NOT NULL,
                account TEXT,
                params TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                state TEXT NOT NULL,
                stage TEXT,
                attempt INTEGER NOT NULL,
                max_attempts INTEGER NOT NULL,
                cancel_requested INTEGER NOT NULL DEFAULT 0,
                force INTEGER NOT NULL DEFAULT 0,
                remote_id TEXT,
                result TEXT,
                error_kind TEXT,
                error_message TEXT,
                created_at REAL NOT NULL,
                started_at REAL,
                heartbeat_at REAL,
                finished_at REAL,
                not_before REAL NOT NULL DEFAULT 0,
                stage_started_at REAL,
                stage_durations TEXT NOT NULL DEFAULT '{}'
            )""",
            "CREATE INDEX tasks_queue ON tasks (state, lane_group, seq)",
            "CREATE INDEX tasks_job ON tasks (job_id)",
            "CREATE INDEX tasks_fingerprint ON tasks (fingerprint, created_at)",
            """CREATE TABLE accounts (
                name TEXT PRIMARY KEY,
                kind TEXT NOT NULL,
                enabled INTEGER NOT NULL,
                reason TEXT,
                needs_attention INTEGER NOT NULL DEFAULT 0
            )""",
        ],
    ),
    (
        2,
        [
            "ALTER TABLE accounts ADD COLUMN updated_at REAL NOT NULL DEFAULT 0",
            "ALTER TABLE tasks ADD COLUMN from_cache INTEGER NOT NULL DEFAULT 0",
            """CREATE TABLE cache_entries (
                fingerprint TEXT PRIMARY KEY,
                model TEXT NOT NULL,
                result TEXT NOT NULL,
                size_bytes INTEGER NOT NULL,
                created_at REAL NOT NULL,
                last_used_at REAL NOT NULL
            )""",
            "CREATE INDEX cache_last_used ON cache_entries (last_used_at)",
        ],
    ),
    (
        3,
        [
            # NULLs never collide in a UNIQUE index: refs are optional.
            "ALTER TABLE tasks ADD COLUMN ref TEXT",
            "CREATE UNIQUE INDEX tasks_job_ref ON tasks (job_id, ref)",
            """CREATE TABLE attempts (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                task_id TEXT NOT NULL REFERENCES tasks(id),
                attempt INTEGER NOT NULL,
                lane_group TEXT NOT NULL,
                account TEXT,
                outcome TEXT NOT NULL,
                started_at REAL,
                ended_at REAL NOT NULL,
                error_kind TEXT,
                error_message TEXT,
                stage_durations TEXT NOT NULL DEFAULT '{}'
            )""",
            "CREATE INDEX attempts_task ON attempts (task_id, id)",
        ],
    ),
    (
        4,
        [
            # A model may now be served by several providers: API tasks queue
            # per model ("api-model:<model>", every serving lane takes it)
            # instead of per provider ("api:<provider>"). Rows stored before
            # move over; `account` keeps the provider a running one is bound
            # to. The attempts table keeps its history as it was written.
            "UPDATE tasks SET lane_group = 'api-model:' || model "
            "WHERE kind = 'api' AND lane_group LIKE 'api:%'",
        ],
    ),
    (
        5,
        [
            # Web accounts added at run time (`dispatcher accounts add`), with
            # the models each serves (a JSON list); profiles' own lists seed
            # the rest and are never stored here.
            """CREATE TABLE web_accounts (
                name TEXT PRIMARY KEY,
                models TEXT NOT NULL,
                added_at REAL NOT NULL
            )""",
        ],
    ),
    (
        6,
        [
            # A cooling-down account (a usage cap) opens again by itself at
            # this epoch second; NULL when it is not cooling down.
            "ALTER TABLE accounts ADD COLUMN cooldown_until REAL",
        ],
    ),
]

LATEST_VERSION = MIGRATIONS[-1][0]
