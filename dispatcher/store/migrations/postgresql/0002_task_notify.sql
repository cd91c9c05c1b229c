-- Every host hears of the task writes of the others (see store/pglisten.py):
-- a new task, a change of state and a cancel asked for are announced on the
-- channel `dispatcher_tasks` by the very write that makes them, so the notice
-- is sent exactly when that write commits and never for one rolled back.
-- Heartbeats and stage changes are not announced: nothing on another host
-- acts on them, and they are most of the writes.
-- The payload is "<task id> <state> <cancel 0|1> <writing host>": the writing
-- host is the connection's `dispatcher.host` setting, so a host skips its own.
-- (A function body is written on one line: the migration runner splits
-- statements at a `;` that ends a line.)

CREATE FUNCTION dispatcher_task_notify() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('dispatcher_tasks', concat_ws(' ', NEW.id, NEW.state, NEW.cancel_requested, coalesce(current_setting('dispatcher.host', true), ''))); RETURN NULL; END $$;

CREATE TRIGGER tasks_notify_insert AFTER INSERT ON tasks
    FOR EACH ROW EXECUTE FUNCTION dispatcher_task_notify();

CREATE TRIGGER tasks_notify_update AFTER UPDATE ON tasks
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
        OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION dispatcher_task_notify();
