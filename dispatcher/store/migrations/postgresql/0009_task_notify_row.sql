-- Issue 31: a task write's notice carries the row it wrote, so the hosts
-- that hear it need no read of their own (a read per notice per host was
-- most of the database's round trips with three hosts). The payload is then
-- {"host": <writing host>, "row": <the task row>}; a row too long for a
-- notice (8000 bytes: a long prompt or result) is announced as before,
-- "<task id> <state> <cancel 0|1> <writing host>", and read back.
-- (A function body is written on one line: the migration runner splits
-- statements at a `;` that ends a line.)

CREATE OR REPLACE FUNCTION dispatcher_task_notify() RETURNS trigger LANGUAGE plpgsql AS $$ DECLARE host text := coalesce(current_setting('dispatcher.host', true), ''); body text := json_build_object('host', host, 'row', row_to_json(NEW))::text; BEGIN IF octet_length(body) < 7900 THEN PERFORM pg_notify('dispatcher_tasks', body); ELSE PERFORM pg_notify('dispatcher_tasks', concat_ws(' ', NEW.id, NEW.state, NEW.cancel_requested, host)); END IF; RETURN NULL; END $$;
