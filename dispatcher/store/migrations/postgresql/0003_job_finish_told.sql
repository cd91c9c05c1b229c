-- The last finish of a job that `job.finished` was told for (the job's
-- latest task `finished_at` then): with several hosts, each finish of a job
-- is told by exactly one of them (a compare-and-set on this column).
ALTER TABLE jobs ADD COLUMN finish_told_at DOUBLE PRECISION;
