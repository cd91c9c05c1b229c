-- NULLs never collide in a UNIQUE index: refs are optional.
ALTER TABLE tasks ADD COLUMN ref TEXT;

CREATE UNIQUE INDEX tasks_job_ref ON tasks (job_id, ref);

CREATE TABLE attempts (
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
);

CREATE INDEX attempts_task ON attempts (task_id, id);
