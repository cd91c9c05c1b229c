-- Webhook deliveries waiting, under way or given up: one row per event and
-- receiver, so a notification outlives a restart and any host sharing the
-- database may deliver it (a claim marks it `delivering` for one host).
-- Delivered rows are deleted; `failed` ones stay for an operator to redeliver.
CREATE TABLE webhook_outbox (
    id TEXT PRIMARY KEY,
    event_id TEXT NOT NULL,
    event TEXT NOT NULL,
    url TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at DOUBLE PRECISION NOT NULL,
    claimed_by TEXT,
    claimed_until DOUBLE PRECISION,
    last_status INTEGER,
    last_error TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (url, state, next_at);
CREATE INDEX webhook_outbox_listed ON webhook_outbox (state, created_at);
