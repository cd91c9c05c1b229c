"""Hearing other hosts' task writes on PostgreSQL: one LISTEN connection per service.

A trigger (migrations `postgresql/0002_task_notify.sql`, `0008`) sends a
notice on `CHANNEL` from every write that creates a task, changes its state
or asks to cancel it, naming the host whose connection wrote it
(`dispatcher.host`, set on every connection of the store's pool by
`host_option`) and carrying the row when it fits in a notice. This module
keeps one connection listening, turns each notice of another host into a
`TaskNotice` for its callback, and reconnects after a lost connection: the
notices sent meanwhile are gone, so it says so (`on_reconnect`) and the
caller looks again at what matters (the scheduler's round and heartbeats
read the rows anyway; they are the fallback for a lost notice). A
provider's Retry-After gate is announced on the same channel; those notices
go to the store's `GateMirror` (`store.pggates`), which is live while this
connection is.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg

from dispatcher.background import stop_background
from dispatcher.store.pgnotice import TaskNotice, own_prefix, parse_notice

if TYPE_CHECKING:
    from dispatcher.store.pggates import GateMirror

log = logging.getLogger("dispatcher.store.listen")

CHANNEL = "dispatcher_tasks"
# With no notice for this long, a query proves the connection alive: a peer
# that vanished without a FIN would otherwise leave us waiting forever.
PING_S = 5.0
# After a read, the socket is left alone this long: notices arriving
# meanwhile wait in it and are read together. Read as each arrived, another
# host's notice cost a listening host ~180 us of CPU at 450 notices a second
# (`python -m bench hosts`, notice row), most of it the wake-up (and the
# scheduler's look at its lanes that follows each batch); ~105 us read every
# 5 ms, ~66 us every 10 ms, ~30 us every 25 ms (three hosts draining: each
# service's CPU a task 0.89 x, over six paired rounds). A cancel, a wake-up or
# a gate reaches this host that much later (a cancel is promised within a
# second; another host's new task is left to it for 0.1 s anyway).
READ_EVERY_S = 0.025
RECONNECT_FIRST_S = 0.2
RECONNECT_MAX_S = 10.0
CONNECT_TIMEOUT_S = 10


def host_option(host: str) -> str:
    """libpq `options` that set `dispatcher.host` on a connection (its notices
    name it). Spaces separate options there unless escaped with a backslash."""
    escaped = host.replace("\\", "\\\\").replace(" ", "\\ ")
    return f"-c dispatcher.host={escaped}"


def listener_name(host: str) -> str:
    """The listening connection's `application_name` (what `pg_stat_activity` shows)."""
    return f"dispatcher-listen {host}"[:63]


class TaskListener:
    """LISTEN on `CHANNEL` for as long as it runs; reconnects when the connection drops."""

    def __init__(
        self,
        url: str,
        host: str,
        on_notice: Callable[[TaskNotice], None],
        *,
        on_reconnect: Callable[[], None] = lambda: None,
        gates: GateMirror | None = None,
    ) -> None:
        self.url = url
        self.host = host
        self.on_notice = on_notice
        self.on_reconnect = on_reconnect
        # The providers' gates, kept from their notices (`store.pggates`).
        self.gates = gates
        self.reconnects = 0  # connections lost and made again
        self.received = 0  # notices of other hosts passed on
        self.reads = 0  # reads of the socket that found notices or more input
        self._work: asyncio.Task[None] | None = None
        self._own = own_prefix(host)
        # Notices psycopg read while a query of ours ran (LISTEN, the gates'
        # read, the ping): heard in order before the socket's next ones.
        self._backlog: collections.deque[str] = collections.deque()

    async def start(self) -> None:
        """Listening once this returns; a first connection that fails says why."""
        conn = await self._connect()
        self._work = asyncio.create_task(self._run(conn), name="pg-listen")

    async def aclose(self) -> None:
        work, self._work = self._work, None
        if work is not None:
            await stop_background(work)

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        conn = await psycopg.AsyncConnection.connect(
            self.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=listener_name(self.host),
            # libpq's TCP keepalives: a dead server is noticed by the kernel too.
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
        )
        self._backlog.clear()  # a lost connection's: looked up (`on_reconnect`)
        conn.add_notify_handler(lambda notify: self._backlog.append(notify.payload))
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
            if self.gates is not None:
                # After LISTEN: a gate written from now on is heard.
                cur = await conn.execute(self.gates.READ)
                self.gates.seed((str(p), float(n)) for p, n in await cur.fetchall())
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _run(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        delay_s = RECONNECT_FIRST_S
        while True:
            try:
                await self._listen(conn)
            except psycopg.Error as exc:
                log.warning("lost the PostgreSQL listener connection (%s); reconnecting", exc)
            finally:
                if self.gates is not None:
                    self.gates.lost()
                await conn.close()
            while True:
                try:
                    conn = await self._connect()
                    break
                except psycopg.Error as exc:
                    log.warning(
                        "PostgreSQL listener: reconnect failed (%s); next try in %.1f s",
                        exc,
                        delay_s,
                    )
                    await asyncio.sleep(delay_s)
                    delay_s = min(RECONNECT_MAX_S, delay_s * 2)
            delay_s = RECONNECT_FIRST_S
            self.reconnects += 1
            log.info("PostgreSQL listener reconnected; notices sent meanwhile are looked up")
            self.on_reconnect()

    async def _listen(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        """Notices as they arrive, read off the connection's socket by a
        reader callback. psycopg's `notifies()` sets up and tears down a
        future, a timer and a reader at each wake-up: ~60 us of our CPU a
        notice, against ~20 here, and one host hears three notices a task,
        each of three hosts nine. Every `PING_S` a query proves the
        connection alive; notices psycopg reads meanwhile come through its
        notify handler (`_connect`), kept in order in `_backlog`. The socket
        is read at most every `READ_EVERY_S`."""
        pgconn = conn.pgconn
        encoding = conn.info.encoding
        loop = asyncio.get_running_loop()
        fd = conn.fileno()
        rearm: asyncio.TimerHandle | None = None
        while True:
            self._hear_backlog()
            ended: asyncio.Future[None] = loop.create_future()

            def readable(ended: asyncio.Future[None] = ended) -> None:
                nonlocal rearm
                loop.remove_reader(fd)
                self.reads += 1
                try:
                    pgconn.consume_input()
                    while (pgn := pgconn.notifies()) is not None:
                        self._heard(pgn.extra.decode(encoding))
                except Exception as exc:  # a lost connection, or a callback's bug
                    if not ended.done():
                        ended.set_exception(exc)
                    return
                rearm = loop.call_later(READ_EVERY_S, read_again)

            def read_again() -> None:
                loop.add_reader(fd, readable)

            loop.add_reader(fd, readable)
            try:
                await asyncio.wait((ended,), timeout=PING_S)
            finally:
                loop.remove_reader(fd)
                if rearm is not None:
                    rearm.cancel()
            if ended.done():
                ended.result()  # raises what ended it
            await conn.execute("SELECT 1")

    def _hear_backlog(self) -> None:
        while self._backlog:
            self._heard(self._backlog.popleft())

    def _heard(self, payload: str) -> None:
        # Every host hears its own writes too: a notice carrying a row is
        # known as one of ours by its start, without decoding the row (on one
        # host, every notice; a JSON parse and a Task built each).
        if payload.startswith(self._own):
            return  # this host's own write: not decoded to be dropped
        if self.gates is not None and self.gates.take(payload):
            return
        notice = parse_notice(payload)
        if notice is None:
            log.warning("PostgreSQL listener: malformed notice %r", payload)
        elif notice.origin != self.host:
            self.received += 1
            self.on_notice(notice)
