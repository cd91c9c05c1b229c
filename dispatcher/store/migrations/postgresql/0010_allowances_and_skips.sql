-- Issue 30. A web account's allowance counts the attempts it started since
-- its daily reset (`generations_since`): by owner and start, without a scan.
CREATE INDEX attempts_owner ON attempts (owner, started_at);
-- A fallback task's models passed over before the one that ran it, and why
-- (JSON: [{"model": ..., "reason": ...}]); NULL when it ran on its first choice.
ALTER TABLE tasks ADD COLUMN skipped TEXT;
