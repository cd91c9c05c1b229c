"""Webhooks: tell the operator's endpoints when a job finishes or an account changes.

`DISPATCHER_WEBHOOK_URLS` lists the endpoints; they are the only places a
notification goes (no redirects followed): the operator's allowlist for
this. Every POST carries the raw JSON body signed with
`DISPATCHER_WEBHOOK_SECRET`:

    X-Dispatcher-Event:     job.finished | account.state_changed | budget.reached
    X-Dispatcher-Delivery:  the event's id (the same on every retry)
    X-Dispatcher-Timestamp: epoch seconds, also in the body as `timestamp`
    X-Dispatcher-Signature: sha256=<hex HMAC-SHA256 of the raw body>

Nothing here runs on a task's path: the event bus listener only puts the
event on a bounded queue; a background worker builds the payloads and
writes one delivery per receiver to the store's outbox (`store.outbox`).
A second worker claims due deliveries, a few per receiver at a time, and
posts them (`webhook_send`: a total deadline per attempt, a few KB of
answer read at most), retrying failures with a growing delay (bounded
attempts). So a delivery waiting for its retry outlives a restart, and any
host sharing the database may send it; each is claimed by one host (at
least once: a host dying mid-post leaves it to another after its hold).
Recent attempts are kept in memory, bounded, for `GET /v1/webhooks/deliveries`;
the given-up ones stay in the outbox until an operator redelivers them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx

from dispatcher.background import stop_background
from dispatcher.clock import Clock
from dispatcher.errors import ConfigError, DispatcherError, InputError, NotFound, StateConflict
from dispatcher.events import AccountChanged, BudgetReached, Event, TaskChanged
from dispatcher.models import JSON, Job, JobState, JobSummary, State, Task, new_id
from dispatcher.notify.send import display_url, post_once, sign
from dispatcher.store import Store
from dispatcher.store.outbox import DELIVERING, FAILED, PENDING, STATES, OutboxItem
from dispatcher.tasks.states import job_state

if TYPE_CHECKING:
    from dispatcher.metrics import Metrics

__all__ = ["Webhooks", "check_urls", "display_url", "sign"]

log = logging.getLogger("dispatcher.notify.webhooks")

JOB_FINISHED = "job.finished"
ACCOUNT_STATE_CHANGED = "account.state_changed"
BUDGET_REACHED = "budget.reached"  # once per provider and day, across hosts
MAX_ATTEMPTS = 5
FIRST_RETRY_DELAY_S = 2.0  # then 4, 8, 16 (scaled by the clock)
# Real seconds for one whole attempt (connect, send, headers, answer).
DEADLINE_S = 10.0
# A claimed delivery is another host's to take once its holder is this late.
HOLD_MARGIN_S = 30.0
MAX_QUEUED_EVENTS = 10_000
MAX_REMEMBERED_JOBS = 10_000  # jobs told as finished, for telling each finish once
# Deliveries under way per receiver: a slow one holds its own slots only.
SLOTS_PER_RECEIVER = 2
# How often (nominal, scaled) the outbox is looked at for retries that fell
# due or deliveries another host left; new events wake the sender at once.
POLL_S = 1.0
LOG_SIZE = 200
MAX_FAILED_LISTED = 100
MAX_LISTED = 500
MIN_SECRET_CHARS = 16
# Given-up deliveries are kept this long for `redeliver`, then forgotten (at
# a start), so the outbox does not grow without end behind a dead receiver.
FAILED_KEPT_S = 30 * 86400.0
STOP_GRACE_S = 2.0


def check_urls(urls: Sequence[str], secret: str | None) -> list[str]:
    """The configured endpoints, or a ConfigError saying what is wrong with them."""
    checked: list[str] = []
    for url in urls:
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise ConfigError(f"webhook URL {url!r} is not a URL: {exc}") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ConfigError(f"webhook URL {display_url(url)!r} must be http(s)://host/...")
        if any(display_url(other) == display_url(url) for other in checked):
            # The outbox names a receiver by its shown URL (no secrets stored).
            raise ConfigError(
                f"webhook URL {display_url(url)!r} is listed twice (only the query differs)"
            )
        checked.append(url)
    if checked and (not secret or len(secret) < MIN_SECRET_CHARS):
        raise ConfigError(
            f"DISPATCHER_WEBHOOK_URLS is set: DISPATCHER_WEBHOOK_SECRET must be set too "
            f"({MIN_SECRET_CHARS}+ characters), so receivers can check the signature"
        )
    return checked


def account_state(account: JSON) -> str:
    """The visible state (`dispatcher.accounts.health`): ok, cooldown, needs_attention, disabled."""
    if account.get("state"):
        return str(account["state"])
    if not account.get("enabled"):
        return "disabled"
    return "needs_attention" if account.get("needs_attention") else "ok"


def job_finished_body(job: Job, summary: JobSummary, failed: Sequence[Task]) -> JSON:
    """What `job.finished` says about the job (without the envelope)."""
    finished_at = summary.last_finished_at or job.created_at
    return {
        "id": job.id,
        "name": job.name,
        "state": job_state(summary.counts).value,
        "counts": {state.value: summary.counts.get(state, 0) for state in State},
        "total": sum(summary.counts.values()),
        "from_cache": summary.from_cache,
        "created_at": job.created_at,
        "finished_at": finished_at,
        "elapsed_s": round(max(0.0, finished_at - job.created_at), 3),
        "failed": [
            {
                "id": task.id,
                "ref": task.ref,
                "model": task.model,
                "attempt": task.attempt,
                "error": task.error.to_json() if task.error else None,
            }
            for task in failed[:MAX_FAILED_LISTED]
        ],
        "failed_listed": min(len(failed), MAX_FAILED_LISTED),
    }


def retry_delay_s(attempt: int) -> float:
    """Nominal delay before attempt `attempt + 1`."""
    return float(FIRST_RETRY_DELAY_S * 2 ** (attempt - 1))


class Webhooks:
    """Queue, build, keep and deliver notifications; a no-op without configured URLs."""

    def __init__(
        self,
        urls: Sequence[str],
        secret: str | None,
        store: Store,
        clock: Clock,
        accounts: Sequence[JSON] = (),
        *,
        host: str = "",
        deadline_s: float = DEADLINE_S,
        metrics: Metrics | None = None,
    ) -> None:
        self.urls = check_urls(urls, secret)
        self._secret = secret or ""
        self._store = store
        self._outbox = store.webhook_outbox
        self._clock = clock
        self._host = host
        self._deadline_s = deadline_s
        self._metrics = metrics
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=MAX_QUEUED_EVENTS)
        self._account_states = {a["name"]: account_state(a) for a in accounts}
        # Jobs already announced as finished; a task of theirs going back to
        # pending (a retry) takes them out, so the next finish is told again.
        self._announced: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._log: collections.deque[JSON] = collections.deque(maxlen=LOG_SIZE)
        self._receivers = {display_url(u): u for u in self.urls}
        self._in_flight: dict[str, set[asyncio.Task[None]]] = {k: set() for k in self._receivers}
        self._wake = asyncio.Event()
        self._builder: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
        self._building = 0
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        return bool(self.urls)

    # -- hearing (on the caller's path: nothing but a queue put) -------------------
    def on_event(self, event: Event) -> None:
        """EventBus listener; called on the event loop's thread."""
        match event:
            case TaskChanged(task=task, origin=None) if task.job_id:
                if task.is_terminal:
                    self._put((JOB_FINISHED, task.job_id))
                else:
                    self._announced.pop(task.job_id, None)
            case AccountChanged(name=name, state=state, view=view):
                new = state.value
                old = self._account_states.get(name)
                self._account_states[name] = new
                if old != new:
                    self._put((ACCOUNT_STATE_CHANGED, {**view, "old_state": old, "new_state": new}))
            case BudgetReached():
                self._put((BUDGET_REACHED, event.to_json()))

    def _put(self, item: tuple[str, Any]) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self._drop(len(self.urls))
            log.warning(
                "webhooks: %d events queued already; dropped %s", MAX_QUEUED_EVENTS, item[0]
            )

    def _drop(self, deliveries: int) -> None:
        self.dropped += deliveries
        if self._metrics is not None:
            self._metrics.webhook_dropped.inc(deliveries)

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.webhook_deliveries.labels(result).inc()

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        if not self.enabled:
            return
        # Deliveries this host held when it stopped (or died) are due again now.
        now = self._clock.now()
        released = await self._outbox.release(self._host, now)
        forgotten = await self._outbox.forget_failed(now - FAILED_KEPT_S)
        if forgotten:
            log.info("webhooks: %d deliveries given up over 30 days ago forgotten", forgotten)
        self._http = httpx.AsyncClient(
            timeout=self._deadline_s,
            follow_redirects=False,  # only the configured URLs, never where they point
            headers={"User-Agent": "dispatcher-webhooks/1", "Content-Type": "application/json"},
        )
        self._builder = asyncio.create_task(self._build_all(), name="webhooks: build")
        self._sender = asyncio.create_task(self._send_all(), name="webhooks: send")
        log.info(
            "webhooks: job.finished, account.state_changed and budget.reached are posted to %s%s",
            ", ".join(self._receivers),
            f" ({released} deliveries taken up again)" if released else "",
        )

    async def aclose(self) -> None:
        if self._builder is not None:
            await stop_background(self._builder)
            self._builder = None
            # Events heard but not yet written are written now, so a restart
            # (or another host) delivers them.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_GRACE_S):
                    while not self._queue.empty():
                        await self._build_one(*self._queue.get_nowait())
            if not self._queue.empty():
                self._drop(self._queue.qsize() * len(self.urls))
                log.error("webhooks: %d events not written at stop", self._queue.qsize())
        if self._sender is not None:
            await stop_background(self._sender)
            self._sender = None
        under_way = [t for tasks in self._in_flight.values() for t in tasks]
        if under_way:
            # A post under way gets a moment to land; the rest go back to
            # pending in the outbox, for the next start or another host.
            await asyncio.wait(under_way, timeout=STOP_GRACE_S)
            for delivery in under_way:
                delivery.cancel()
            await asyncio.gather(*under_way, return_exceptions=True)
        if self.enabled:
            try:
                await self._outbox.release(self._host, self._clock.now())
            except DispatcherError as exc:
                log.warning("webhooks: deliveries under way not released at stop: %s", exc)
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # -- building ----------------------------------------------------------------------
    async def _build_all(self) -> None:
        while True:
            kind, subject = await self._queue.get()
            # Still queued while it is built: `deliveries_view` says 0 only once
            # every event heard is in the outbox (or was another host's to tell).
            self._building += 1
            try:
                await self._build_one(kind, subject)
            finally:
                self._building -= 1

    async def _build_one(self, kind: str, subject: Any) -> None:
        try:
            built = await self._build(kind, subject)
            if built is None:
                return
            event, event_id, body = built
            now = self._clock.now()
            await self._outbox.add(
                [
                    OutboxItem(new_id(), event_id, event, shown, body, PENDING, 0, now, None)
                    for shown in self._receivers
                ]
            )
        except Exception:  # a notification must never take the worker down
            self._drop(len(self.urls))
            log.exception("webhooks: cannot build or keep %s", kind)
            return
        self._wake.set()

    async def _build(self, kind: str, subject: Any) -> tuple[str, str, str] | None:
        if kind == JOB_FINISHED:
            return await self._job_finished(str(subject))
        if kind == BUDGET_REACHED:
            # Every host sharing the database finds the budget reached on its
            # own (each says so on its own SSE stream); the store lets one of
            # them tell the receivers.
            if not await self._store.tell_budget_reached(
                subject["provider"], subject["until"], self._clock.now()
            ):
                return None
            fields = {k: v for k, v in subject.items() if k != "type"}
            return self._envelope(BUDGET_REACHED, {"budget": fields})
        account = subject
        return self._envelope(
            ACCOUNT_STATE_CHANGED,
            {
                "account": {
                    "name": account["name"],
                    "kind": account["kind"],
                    "old_state": account["old_state"],
                    "new_state": account["new_state"],
                    "reason": account.get("reason"),
                    "until": account.get("until"),
                }
            },
        )

    async def _job_finished(self, job_id: str) -> tuple[str, str, str] | None:
        if job_id in self._announced:
            return None
        job = await self._store.get_job(job_id)
        if job is None:
            return None
        summary = (await self._store.job_summaries([job_id]))[job_id]
        if job_state(summary.counts) is JobState.RUNNING:
            return None
        self._announced[job_id] = None
        while len(self._announced) > MAX_REMEMBERED_JOBS:
            self._announced.popitem(last=False)
        if not await self._store.tell_job_finish(job_id, summary.last_finished_at or 0.0):
            # Another host finished the job's other last task at the same
            # moment and tells this finish (each host tells its own writes).
            return None
        failed = await self._store.list_tasks(
            states=[State.FAILED], job_id=job_id, limit=MAX_FAILED_LISTED
        )
        return self._envelope(JOB_FINISHED, {"job": job_finished_body(job, summary, failed)})

    def _envelope(self, event: str, fields: JSON) -> tuple[str, str, str]:
        event_id = new_id()
        body = {"event": event, "id": event_id, "timestamp": int(self._clock.now()), **fields}
        return event, event_id, json.dumps(body, separators=(",", ":"))

    # -- delivering ----------------------------------------------------------------------
    async def _send_all(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._claim_due()
            except DispatcherError as exc:  # the store is away: the next round tries again
                log.warning("webhooks: cannot read the outbox: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._clock.scaled(POLL_S))

    async def _claim_due(self) -> None:
        for shown, url in self._receivers.items():
            running = self._in_flight[shown]
            free = SLOTS_PER_RECEIVER - len(running)
            if free <= 0:
                continue
            now = self._clock.now()
            hold_until = now + self._deadline_s + HOLD_MARGIN_S
            for item in await self._outbox.claim(shown, self._host, now, hold_until, free):
                delivery = asyncio.create_task(self._deliver(url, item))
                running.add(delivery)
                delivery.add_done_callback(self._delivery_done(shown))

    def _delivery_done(self, shown: str) -> Any:
        def done(delivery: asyncio.Task[None]) -> None:
            self._in_flight[shown].discard(delivery)
            self._wake.set()  # a slot is free: the receiver's next due delivery may go

        return done

    async def _deliver(self, url: str, item: OutboxItem) -> None:
        assert self._http is not None
        raw = item.body.encode()
        timestamp = json.loads(raw)["timestamp"]
        headers = {
            "X-Dispatcher-Event": item.event,
            "X-Dispatcher-Delivery": item.event_id,
            "X-Dispatcher-Timestamp": str(timestamp),
            "X-Dispatcher-Signature": sign(self._secret, raw),
        }
        attempt = item.attempts + 1
        started = self._clock.monotonic()
        answer = await post_once(self._http, url, raw, headers, self._deadline_s)
        final = answer.ok or not answer.retryable or attempt >= MAX_ATTEMPTS
        self._log.append(
            {
                "id": item.id,
                "event": item.event,
                "event_id": item.event_id,
                "url": item.url,
                "attempt": attempt,
                "at": self._clock.now(),
                "status": answer.status,
                "ok": answer.ok,
                "error": answer.error,
                "duration_ms": round((self._clock.monotonic() - started) * 1000, 1),
                "final": final,
            }
        )
        why = answer.error or f"HTTP {answer.status}"
        now = self._clock.now()
        if answer.ok:
            state, next_at, result = None, now, "delivered"
        elif final:
            state, next_at, result = FAILED, now, "failed"
            log.error(
                "webhooks: %s %s to %s given up after attempt %d: %s "
                "(`dispatcher webhooks redeliver %s` sends it again)",
                item.event,
                item.event_id,
                item.url,
                attempt,
                why,
                item.id,
            )
        else:
            delay_s = self._clock.scaled(retry_delay_s(attempt))
            state, next_at, result = PENDING, now + delay_s, "retry"
            log.warning(
                "webhooks: %s to %s failed (attempt %d/%d: %s); retrying in %.1fs",
                item.event,
                item.url,
                attempt,
                MAX_ATTEMPTS,
                why,
                delay_s,
            )
        self._count(result)
        if result == "failed":
            self._drop(1)
        try:
            kept = await self._outbox.finish(
                item.id,
                self._host,
                state=state,
                attempts=attempt,
                next_at=next_at,
                status=answer.status,
                error=answer.error,
                now=now,
            )
        except DispatcherError as exc:
            # Left delivering: another host (or this one after a restart)
            # takes it up once its hold passes; at least once.
            log.warning("webhooks: attempt of %s not recorded: %s", item.id, exc)
            return
        if not kept:
            log.warning("webhooks: %s was taken over by another host meanwhile", item.id)

    # -- telling -----------------------------------------------------------------------
    async def deliveries_view(self) -> JSON:
        counts = await self._outbox.counts()
        return {
            "urls": list(self._receivers),
            "queued": self._queue.qsize() + self._building + counts[PENDING],
            "delivering": counts[DELIVERING],
            "failed": counts[FAILED],
            # Events that will not reach a receiver unless redelivered: given
            # up (still in the outbox) or never written (queue full, store down).
            "dropped": self.dropped,
            "items": list(reversed(self._log)),
        }

    async def outbox_view(self, state: str | None, limit: int) -> JSON:
        if state is not None and state not in STATES:
            raise InputError(f"no delivery state {state!r}: use one of {', '.join(STATES)}")
        limit = max(1, min(limit, MAX_LISTED))
        items = await self._outbox.items([state] if state else STATES, limit)
        return {"items": [i.to_json() for i in items]}

    async def redeliver(self, item_id: str) -> JSON:
        existing = await self._outbox.get(item_id)
        if existing is not None and existing.url not in self._receivers:
            raise StateConflict(
                f"webhook delivery {item_id} is for {existing.url}, which is not in "
                "DISPATCHER_WEBHOOK_URLS here"
            )
        item = await self._outbox.redeliver(item_id, self._clock.now())
        if item is None:
            existing = await self._outbox.get(item_id)
            if existing is None:
                raise NotFound(f"no webhook delivery {item_id!r}")
            raise StateConflict(
                f"webhook delivery {item_id} is {existing.state}: only a failed one is redelivered"
            )
        self._wake.set()
        log.info("webhooks: %s to %s redelivered by the operator", item.event, item.url)
        return item.to_json()
