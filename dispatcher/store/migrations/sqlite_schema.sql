-- The SQLite schema after every migration in sqlite/; kept by hand, checked by a test.
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at REAL NOT NULL,
    finish_told_at REAL  -- the job's last finish `job.finished` was told for
);

CREATE TABLE tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    job_id TEXT REFERENCES jobs(id),
    model TEXT NOT NULL,
    kind TEXT NOT NULL,
    queue TEXT NOT NULL,
    owner TEXT,
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
    stage_durations TEXT NOT NULL DEFAULT '{}',
    from_cache INTEGER NOT NULL DEFAULT 0,
    ref TEXT,
    host TEXT,
    lease_token INTEGER,
    cost_estimate REAL,
    cost REAL,
    priority INTEGER NOT NULL DEFAULT 0,
    deadline_action TEXT NOT NULL DEFAULT 'run',
    deadline REAL,
    alt_queues TEXT,
    skipped TEXT  -- a fallback's models passed over, and why (JSON)
);
CREATE INDEX tasks_queue ON tasks (state, queue, seq);
CREATE INDEX tasks_job ON tasks (job_id);
CREATE INDEX tasks_fingerprint ON tasks (fingerprint, created_at);
CREATE UNIQUE INDEX tasks_job_ref ON tasks (job_id, ref);
CREATE INDEX tasks_spend ON tasks (owner, started_at);
CREATE INDEX tasks_ranked ON tasks (queue, seq)
    WHERE state = 'pending' AND (priority <> 0 OR deadline IS NOT NULL);
CREATE INDEX tasks_fallback ON tasks (seq) WHERE state = 'pending' AND alt_queues IS NOT NULL;

-- One row per ended attempt (success, failure, cancel, stale reclaim, re-queue);
-- the tasks row keeps the current attempt.
CREATE TABLE attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL REFERENCES tasks(id),
    attempt INTEGER NOT NULL,
    queue TEXT NOT NULL,
    owner TEXT,
    outcome TEXT NOT NULL,
    started_at REAL,
    ended_at REAL NOT NULL,
    error_kind TEXT,
    error_message TEXT,
    stage_durations TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX attempts_task ON attempts (task_id, id);
CREATE INDEX attempts_owner ON attempts (owner, started_at);

CREATE TABLE accounts (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    enabled INTEGER NOT NULL,
    reason TEXT,
    needs_attention INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL DEFAULT 0,
    cooldown_until REAL
);

CREATE TABLE cache_entries (
    fingerprint TEXT NOT NULL,
    host TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL,
    result TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL,
    PRIMARY KEY (fingerprint, host)
);
CREATE INDEX cache_last_used ON cache_entries (last_used_at);

CREATE TABLE web_accounts (
    name TEXT PRIMARY KEY,
    models TEXT NOT NULL,
    added_at REAL NOT NULL
);

CREATE TABLE hosts (
    id TEXT PRIMARY KEY,
    url TEXT,
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    dead_at REAL
);

CREATE TABLE leases (
    account TEXT PRIMARY KEY,
    host TEXT,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
);

CREATE TABLE budget_told (
    provider TEXT NOT NULL,
    until REAL NOT NULL,  -- 00:00 UTC after the day `budget.reached` was told for
    told_at REAL NOT NULL,
    PRIMARY KEY (provider, until)
);

CREATE TABLE gates (
    provider TEXT PRIMARY KEY,
    not_before REAL NOT NULL
);

CREATE TABLE webhook_outbox (
    id TEXT PRIMARY KEY,
    event_id TEXT NOT NULL,
    event TEXT NOT NULL,
    url TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL,
    claimed_by TEXT,
    claimed_until REAL,
    last_status INTEGER,
    last_error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (url, state, next_at);
CREATE INDEX webhook_outbox_listed ON webhook_outbox (state, created_at);
