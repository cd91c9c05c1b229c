-- One word for one thing: a task waits in its model's `queue` (was
-- `lane_group`) and is held by its `owner`, the web account or API provider
-- whose lane runs it (was `account`, a word that also names a web account
-- alone). The leases keep `account`: a lease is a web account's. Indexes
-- follow a renamed column by themselves.
ALTER TABLE tasks RENAME COLUMN lane_group TO queue;
ALTER TABLE tasks RENAME COLUMN account TO owner;
ALTER TABLE attempts RENAME COLUMN lane_group TO queue;
ALTER TABLE attempts RENAME COLUMN account TO owner;
