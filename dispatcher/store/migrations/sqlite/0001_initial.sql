CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at REAL NOT NULL
);

CREATE TABLE tasks (
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
);

CREATE INDEX tasks_queue ON tasks (state, lane_group, seq);

CREATE INDEX tasks_job ON tasks (job_id);

CREATE INDEX tasks_fingerprint ON tasks (fingerprint, created_at);

CREATE TABLE accounts (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    enabled INTEGER NOT NULL,
    reason TEXT,
    needs_attention INTEGER NOT NULL DEFAULT 0
);
