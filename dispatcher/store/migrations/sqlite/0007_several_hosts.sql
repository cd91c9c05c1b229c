-- Several hosts on one database (see the PostgreSQL twin of this file). On
-- SQLite there is one host; the tables exist so that both backends answer
-- the same `Store` operations.

-- The host that ran a task's current attempt, and the account lease token
-- it ran under (a write with an older token is refused).
ALTER TABLE tasks ADD COLUMN host TEXT;
ALTER TABLE tasks ADD COLUMN lease_token INTEGER;

CREATE TABLE hosts (
    id TEXT PRIMARY KEY,
    url TEXT,
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    dead_at REAL
);

-- A web account is served by one host at a time. The token grows with every
-- grant and is never reused: a row is kept (host NULL) once released.
CREATE TABLE leases (
    account TEXT PRIMARY KEY,
    host TEXT,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
);

-- A provider's Retry-After: no host sends to it before `not_before`.
CREATE TABLE gates (
    provider TEXT PRIMARY KEY,
    not_before REAL NOT NULL
);

-- The cache index records the host holding each entry's files: the key
-- becomes (fingerprint, host). Entries from before belong to this host ('').
CREATE TABLE cache_entries_hosted (
    fingerprint TEXT NOT NULL,
    host TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL,
    result TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL,
    PRIMARY KEY (fingerprint, host)
);

INSERT INTO cache_entries_hosted
    (fingerprint, host, model, result, size_bytes, created_at, last_used_at)
    SELECT fingerprint, '', model, result, size_bytes, created_at, last_used_at
    FROM cache_entries;

DROP TABLE cache_entries;

ALTER TABLE cache_entries_hosted RENAME TO cache_entries;

CREATE INDEX cache_last_used ON cache_entries (last_used_at);
