-- Issue 30. `cost_estimate`: dollars from the profile's price table at
-- intake (what a claim under a daily budget reserves while the task runs);
-- `cost`: what the finished task cost (the vendor's reported usage, else the
-- estimate; 0 for a cache answer). `priority` and `deadline` order a queue:
-- higher priority first, then the earliest deadline, then FIFO.
ALTER TABLE tasks ADD COLUMN cost_estimate REAL;
ALTER TABLE tasks ADD COLUMN cost REAL;
ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
-- `deadline_action`: "cancel" cancels a task that can no longer meet its
-- deadline when its turn comes; "run" runs it, flagged late.
ALTER TABLE tasks ADD COLUMN deadline_action TEXT NOT NULL DEFAULT 'run';
ALTER TABLE tasks ADD COLUMN deadline REAL;
-- A day's spend of one provider: the tasks it started since 00:00 UTC.
CREATE INDEX tasks_spend ON tasks (owner, started_at);
-- Whether a queue holds a task with a priority or a deadline (the claim sorts
-- the queue only then; plain FIFO follows the queue index).
CREATE INDEX tasks_ranked ON tasks (queue, seq)
    WHERE state = 'pending' AND (priority <> 0 OR deadline IS NOT NULL);
-- Fallbacks: the other queues a task also waits in ("|q1|q2|"), for models
-- named equivalent; NULL for most tasks. One row: one claim wins, once.
ALTER TABLE tasks ADD COLUMN alt_queues TEXT;
CREATE INDEX tasks_fallback ON tasks (seq) WHERE state = 'pending' AND alt_queues IS NOT NULL;
