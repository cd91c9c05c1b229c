"""Webhooks: tell the operator's endpoints when a job finishes or an account changes.

`DISPATCHER_WEBHOOK_URLS` lists the endpoints; they are the only places a
notification goes (no redirects followed): the operator's allowlist for
this. Every POST carries the raw JSON body signed with
`DISPATCHER_WEBHOOK_SECRET`:

    X-Dispatcher-Event:     job.finished | account.state_changed
    X-Dispatcher-Delivery:  the event's id (the same on every retry)
    X-Dispatcher-Timestamp: epoch seconds, also in the body as `timestamp`
    X-Dispatcher-Signature: sha256=<hex HMAC-SHA256 of the raw body>

Nothing here runs on a task's path: the event bus listener only puts the
event on a bounded queue; a background worker builds the payloads and
delivers them, retrying failures with a growing delay (bounded attempts).
Recent attempts are kept in memory, bounded, for `GET /v1/webhooks/deliveries`.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from dispatcher.background import stop_job
from dispatcher.clock import Clock
from dispatcher.errors import ConfigError
from dispatcher.events import AccountChanged, Event, TaskChanged
from dispatcher.models import JSON, Job, JobState, JobSummary, State, Task, new_id
from dispatcher.states import job_state
from dispatcher.store import Store

log = logging.getLogger("dispatcher.webhooks")

JOB_FINISHED = "job.finished"
ACCOUNT_STATE_CHANGED = "account.state_changed"
MAX_ATTEMPTS = 5
FIRST_RETRY_DELAY_S = 2.0  # then 4, 8, 16 (scaled by the clock)
TIMEOUT_S = 10.0
MAX_QUEUED_EVENTS = 10_000
MAX_REMEMBERED_JOBS = 10_000  # jobs told as finished, for telling each finish once
MAX_CONCURRENT = 4
LOG_SIZE = 200
MAX_FAILED_LISTED = 100
MIN_SECRET_CHARS = 16
STOP_GRACE_S = 2.0
# Statuses worth another try; any other 4xx (and a redirect) will not change.
_RETRY_STATUSES = frozenset({408, 425, 429})


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for a raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def display_url(url: str) -> str:
    """The URL without user info or query, which may carry the receiver's secrets."""
    parsed = httpx.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"


def check_urls(urls: Sequence[str], secret: str | None) -> list[str]:
    """The configured endpoints, or a ConfigError saying what is wrong with them."""
    checked = []
    for url in urls:
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise ConfigError(f"webhook URL {url!r} is not a URL: {exc}") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ConfigError(f"webhook URL {display_url(url)!r} must be http(s)://host/...")
        checked.append(url)
    if checked and (not secret or len(secret) < MIN_SECRET_CHARS):
        raise ConfigError(
            f"DISPATCHER_WEBHOOK_URLS is set: DISPATCHER_WEBHOOK_SECRET must be set too "
            f"({MIN_SECRET_CHARS}+ characters), so receivers can check the signature"
        )
    return checked


def account_state(account: JSON) -> str:
    """The visible state (`dispatcher.health`): ok, cooldown, needs_attention, disabled."""
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


@dataclass(frozen=True)
class Outgoing:
    event: str
    event_id: str
    body: bytes


class Webhooks:
    """Queue, build and deliver notifications; a no-op without configured URLs."""

    def __init__(
        self,
        urls: Sequence[str],
        secret: str | None,
        store: Store,
        clock: Clock,
        accounts: Sequence[JSON] = (),
    ) -> None:
        self.urls = check_urls(urls, secret)
        self._secret = secret or ""
        self._store = store
        self._clock = clock
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=MAX_QUEUED_EVENTS)
        self._account_states = {a["name"]: account_state(a) for a in accounts}
        # Jobs already announced as finished; a task of theirs going back to
        # pending (a retry) takes them out, so the next finish is told again.
        self._announced: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._log: collections.deque[JSON] = collections.deque(maxlen=LOG_SIZE)
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        self._deliveries: set[asyncio.Task[None]] = set()
        self._worker: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
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

    def _put(self, item: tuple[str, Any]) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning(
                "webhooks: %d events queued already; dropped %s", MAX_QUEUED_EVENTS, item[0]
            )

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        if not self.enabled:
            return
        self._http = httpx.AsyncClient(
            timeout=TIMEOUT_S,
            follow_redirects=False,  # only the configured URLs, never where they point
            headers={"User-Agent": "dispatcher-webhooks/1", "Content-Type": "application/json"},
        )
        self._worker = asyncio.create_task(self._work(), name="webhooks")
        log.info(
            "webhooks: job.finished and account.state_changed are posted to %s",
            ", ".join(display_url(u) for u in self.urls),
        )

    async def aclose(self) -> None:
        if self._worker is not None:
            await stop_job(self._worker)
            self._worker = None
        if self._deliveries:
            # A delivery under way gets a moment to land; retries waiting for
            # their turn are given up (the log says so).
            await asyncio.wait(list(self._deliveries), timeout=STOP_GRACE_S)
            for delivery in list(self._deliveries):
                delivery.cancel()
            await asyncio.gather(*self._deliveries, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # -- building ----------------------------------------------------------------------
    async def _work(self) -> None:
        while True:
            kind, subject = await self._queue.get()
            try:
                outgoing = await self._build(kind, subject)
            except Exception:  # a notification must never take the worker down
                log.exception("webhooks: cannot build %s", kind)
                continue
            if outgoing is None:
                continue
            for url in self.urls:
                await self._slots.acquire()
                delivery = asyncio.create_task(self._deliver(url, outgoing))
                self._deliveries.add(delivery)
                delivery.add_done_callback(self._delivery_done)

    def _delivery_done(self, delivery: asyncio.Task[None]) -> None:
        self._deliveries.discard(delivery)
        self._slots.release()

    async def _build(self, kind: str, subject: Any) -> Outgoing | None:
        if kind == JOB_FINISHED:
            return await self._job_finished(str(subject))
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

    async def _job_finished(self, job_id: str) -> Outgoing | None:
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

    def _envelope(self, event: str, fields: JSON) -> Outgoing:
        event_id = new_id()
        body = {"event": event, "id": event_id, "timestamp": int(self._clock.now()), **fields}
        return Outgoing(event, event_id, json.dumps(body, separators=(",", ":")).encode())

    # -- delivering ----------------------------------------------------------------------
    async def _deliver(self, url: str, outgoing: Outgoing) -> None:
        assert self._http is not None
        timestamp = json.loads(outgoing.body)["timestamp"]
        headers = {
            "X-Dispatcher-Event": outgoing.event,
            "X-Dispatcher-Delivery": outgoing.event_id,
            "X-Dispatcher-Timestamp": str(timestamp),
            "X-Dispatcher-Signature": sign(self._secret, outgoing.body),
        }
        shown = display_url(url)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            started = self._clock.monotonic()
            status: int | None = None
            error: str | None = None
            try:
                response = await self._http.post(url, content=outgoing.body, headers=headers)
                status = response.status_code
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}".replace(url, shown)[:300]
            ok = status is not None and 200 <= status < 300
            retryable = status is None or status >= 500 or status in _RETRY_STATUSES
            final = ok or not retryable or attempt == MAX_ATTEMPTS
            self._log.append(
                {
                    "event": outgoing.event,
                    "event_id": outgoing.event_id,
                    "url": shown,
                    "attempt": attempt,
                    "at": self._clock.now(),
                    "status": status,
                    "ok": ok,
                    "error": error,
                    "duration_ms": round((self._clock.monotonic() - started) * 1000, 1),
                    "final": final,
                }
            )
            if ok:
                return
            why = error or f"HTTP {status}"
            if final:
                log.error(
                    "webhooks: %s %s to %s given up after attempt %d: %s",
                    outgoing.event,
                    outgoing.event_id,
                    shown,
                    attempt,
                    why,
                )
                return
            delay_s = self._clock.scaled(retry_delay_s(attempt))
            log.warning(
                "webhooks: %s to %s failed (attempt %d/%d: %s); retrying in %.1fs",
                outgoing.event,
                shown,
                attempt,
                MAX_ATTEMPTS,
                why,
                delay_s,
            )
            await self._clock.sleep(retry_delay_s(attempt))

    # -- telling -----------------------------------------------------------------------
    def deliveries_view(self) -> JSON:
        return {
            "urls": [display_url(u) for u in self.urls],
            "queued": self._queue.qsize(),
            "delivering": len(self._deliveries),
            "dropped": self.dropped,
            "items": list(reversed(self._log)),
        }
