"""Other hosts' task writes as events on this host's bus (PostgreSQL only).

The listener (`store.pglisten`) hears that another host created a task,
changed its state or asked to cancel it, mostly with the row written; this
relay publishes each row (read back when the notice could not carry it) as
a `TaskChanged` carrying the writer as `origin`. So the
scheduler's one `_on_event` handles a wake-up (a new pending task) and a
cancel (a running task of ours flagged) whatever host they came from, and
the event stream on any host shows the tasks of all hosts. A row read back
that has already left the state its notice named is not told: such a task,
claimed at once by another host, may show up `running` first.

While no stream subscribes (no `GET /v1/events` client, no login page
open), nobody on this host shows another host's rows: each notice is then
told to the bus's listeners by its header alone (`TaskNoticed`: the task,
its state, its cancel flag, the writer), the row not decoded, and the
scheduler handles it as it would the row. A notice costs a listening host
~15 us less so (`python -m bench hosts`, notice row).

Notices arrive in bursts (a job of 150 tasks is 150 notices): they are
queued and handled in batches, one query per batch for the rows to read. SQLite serves one
host: it has no relay, its bus hears everything in process.
"""

from __future__ import annotations

import asyncio
import logging

from dispatcher.background import stop_background
from dispatcher.events import EventBus, TaskChanged, TaskNoticed
from dispatcher.models import State, Task
from dispatcher.store import Store
from dispatcher.store.pgclaimview import ClaimView
from dispatcher.store.pglisten import TaskListener
from dispatcher.store.pgnotice import TaskNotice
from dispatcher.store.postgres import PostgresStore
from dispatcher.store.rows import state_named

log = logging.getLogger("dispatcher.hosts.crosshost")

BATCH = 500  # notices read back per query


class RemoteTasks:
    """Listens for other hosts' task writes and publishes them locally."""

    def __init__(self, url: str, host: str, store: Store, events: EventBus) -> None:
        self.host = host
        self.store = store
        self.events = events
        self._queue: asyncio.Queue[TaskNotice | None] = asyncio.Queue()
        self.listener = TaskListener(
            url,
            host,
            self._queue.put_nowait,
            on_reconnect=self._caught,
            # The gates' notices keep the store's copy (its `get_gate` reads no row then).
            gates=store.gates if isinstance(store, PostgresStore) else None,
        )
        self._relay: asyncio.Task[None] | None = None
        self.published = 0

    async def start(self) -> None:
        await self.listener.start()
        self._relay = asyncio.create_task(self._run(), name="remote-tasks")

    async def aclose(self) -> None:
        await self.listener.aclose()
        relay, self._relay = self._relay, None
        if relay is not None:
            await stop_background(relay)

    def _caught(self) -> None:
        """After a lost connection: a `None` in the queue asks for a look at
        this host's running tasks, whose cancel may have been missed."""
        self._queue.put_nowait(None)

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            batch = [first]
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._publish(batch)
            except Exception:
                # A failed read (the database away) must not end the relay: the
                # scheduler's rounds and heartbeats read the rows themselves.
                log.exception("could not read the tasks other hosts changed")

    async def _publish(self, batch: list[TaskNotice | None]) -> None:
        # The last notice per task: a row is published as the notice says it
        # was written. A row read after it moved on is left to the notice of
        # its newer write (every change of state sends one), so each state a
        # row is found in is told once, and none out of order.
        last = {n.task_id: n for n in batch if n is not None}
        view = self.store.claim_view if isinstance(self.store, PostgresStore) else None
        if not self.events.has_subscribers:
            # No stream shows the rows now: the listeners are told by each
            # notice's header, no row decoded (`store.pgnotice`).
            last = self._tell_headers(last, view)
        # Most notices carry their row; the others (a row too long for a
        # notice) are read back, one query for the batch.
        unread = [task_id for task_id, n in last.items() if not n.carries_row]
        read = {t.id: t for t in await self.store.get_tasks(unread)} if unread else {}
        found = []
        for task_id, notice in last.items():
            task = notice.task() if notice.carries_row else read.get(task_id)
            if task is not None and _as_noticed(task, notice):
                found.append((task, notice.origin))
        if None in batch:
            running = await self.store.tasks_in_state(State.RUNNING, host=self.host)
            found += [(t, "") for t in running if t.cancel_requested and t.id not in last]
        for task, origin in found:
            if view is not None:
                # Before the scheduler hears it: a task pending, a quota
                # freed, is claimed.
                view.saw(task)
            self.published += 1
            self.events.publish(TaskChanged(task, origin=origin))

    def _tell_headers(
        self, last: dict[str, TaskNotice], view: ClaimView | None
    ) -> dict[str, TaskNotice]:
        """Tells the notices that carried their row by their header; returns
        the others (read back, then published whole)."""
        rest = {}
        for task_id, notice in last.items():
            state = state_named(notice.state)
            if not notice.carries_row or state is None:
                rest[task_id] = notice
                continue
            if view is not None:
                view.noted(task_id, state, notice.owner)
            self.events.tell(TaskNoticed(task_id, state, notice.cancel_requested, notice.origin))
        return rest


def _as_noticed(task: Task, notice: TaskNotice) -> bool:
    return task.state.value == notice.state and task.cancel_requested == notice.cancel_requested
