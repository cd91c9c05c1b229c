-- A claim's plan must not depend on the table's statistics. On a new
-- database (no ANALYZE yet) the claim's prepared plan found the pending
-- tasks through `tasks_running` (state, owner), whose leading `state` serves
-- `state = 'pending'` as well: every pending task was read and sorted for
-- each claim, and the claimed row itself was found among them, not by its
-- key. With a backlog of a few hundred tasks that was most of the
-- database's CPU per task (benchmark 6, three hosts, issue 31). The index
-- now holds the running tasks alone, which is all it is for (a provider's
-- running tasks, counted by every claim under its quota): no plan can use it
-- for pending tasks, and a write that leaves `running` adds no entry to it.
DROP INDEX tasks_running;
CREATE INDEX tasks_running ON tasks (owner) WHERE state = 'running';
