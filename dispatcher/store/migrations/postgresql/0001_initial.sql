-- The schema SQLite reached by its version 7 (sqlite/0001..0007), for
-- PostgreSQL: several hosts on one database. Flags stay integers (0/1) and
-- JSON stays text, so both backends share their statements (store/sql.py).

CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    seq BIGSERIAL NOT NULL UNIQUE
);

CREATE TABLE tasks (
    seq BIGSERIAL PRIMARY KEY,
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
    created_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    heartbeat_at DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    not_before DOUBLE PRECISION NOT NULL DEFAULT 0,
    stage_started_at DOUBLE PRECISION,
    stage_durations TEXT NOT NULL DEFAULT '{}',
    from_cache INTEGER NOT NULL DEFAULT 0,
    ref TEXT,
    -- The host that ran the current attempt and the account lease token it
    -- ran under (a write with an older token is refused).
    host TEXT,
    lease_token BIGINT
);

CREATE INDEX tasks_queue ON tasks (state, lane_group, seq);

CREATE INDEX tasks_job ON tasks (job_id);

CREATE INDEX tasks_fingerprint ON tasks (fingerprint, created_at);

-- NULLs never collide in a UNIQUE index: refs are optional.
CREATE UNIQUE INDEX tasks_job_ref ON tasks (job_id, ref);

-- A provider's running tasks, counted by every claim under its global quota.
CREATE INDEX tasks_running ON tasks (state, account);

-- What a host ran, for its own reconciliation and a dead host's recovery.
CREATE INDEX tasks_host ON tasks (host, state);

CREATE TABLE attempts (
    id BIGSERIAL PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks(id),
    attempt INTEGER NOT NULL,
    lane_group TEXT NOT NULL,
    account TEXT,
    outcome TEXT NOT NULL,
    started_at DOUBLE PRECISION,
    ended_at DOUBLE PRECISION NOT NULL,
    error_kind TEXT,
    error_message TEXT,
    stage_durations TEXT NOT NULL DEFAULT '{}'
);

CREATE INDEX attempts_task ON attempts (task_id, id);

CREATE TABLE accounts (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    enabled INTEGER NOT NULL,
    reason TEXT,
    needs_attention INTEGER NOT NULL DEFAULT 0,
    updated_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    cooldown_until DOUBLE PRECISION
);

-- One row per fingerprint and host holding its files.
CREATE TABLE cache_entries (
    fingerprint TEXT NOT NULL,
    host TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL,
    result TEXT NOT NULL,
    size_bytes BIGINT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    last_used_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (fingerprint, host)
);

CREATE INDEX cache_last_used ON cache_entries (host, last_used_at);

CREATE TABLE web_accounts (
    name TEXT PRIMARY KEY,
    models TEXT NOT NULL,
    added_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE hosts (
    id TEXT PRIMARY KEY,
    url TEXT,
    started_at DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL,
    dead_at DOUBLE PRECISION
);

-- A web account is served by one host at a time. The token grows with every
-- grant and is never reused: a row is kept (host NULL) once released.
CREATE TABLE leases (
    account TEXT PRIMARY KEY,
    host TEXT,
    token BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);

-- A provider's Retry-After: no host sends to it before `not_before`.
CREATE TABLE gates (
    provider TEXT PRIMARY KEY,
    not_before DOUBLE PRECISION NOT NULL
);
