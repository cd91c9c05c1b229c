ALTER TABLE accounts ADD COLUMN updated_at REAL NOT NULL DEFAULT 0;

ALTER TABLE tasks ADD COLUMN from_cache INTEGER NOT NULL DEFAULT 0;

CREATE TABLE cache_entries (
    fingerprint TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    result TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL
);

CREATE INDEX cache_last_used ON cache_entries (last_used_at);
