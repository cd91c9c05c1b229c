"""Prometheus metrics: live numbers read at scrape time, durations observed as they end."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dispatcher.background import stop_background
from dispatcher.events import Event, TaskChanged
from dispatcher.models import State, Task

if TYPE_CHECKING:
    from dispatcher.accounts.switches import AccountBook
    from dispatcher.scheduling.protocol import MemoryView, Runner
    from dispatcher.scheduling.scheduler import Scheduler
    from dispatcher.store import Store
    from dispatcher.tasks.ledger import Ledger

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_DURATION_BUCKETS_S = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
# Real seconds, never scaled: a stall of the event loop is the machine's time.
LAG_PROBE_INTERVAL_S = 0.1
LAG_WINDOW_S = 60.0


class LagWindow:
    """The largest event-loop lag seen over the last `window_s` seconds."""

    def __init__(self, window_s: float = LAG_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()  # (when, lag), oldest first

    def add(self, at: float, lag_s: float) -> None:
        self._forget(at)
        # A smaller lag after a larger one can never be the maximum while
        # the larger one is in the window: it is not worth keeping.
        while self._samples and self._samples[-1][1] <= lag_s:
            self._samples.pop()
        self._samples.append((at, lag_s))

    def max_s(self, now: float) -> float:
        self._forget(now)
        return self._samples[0][1] if self._samples else 0.0

    def _forget(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()


class LoopLagProbe:
    """Measures how late the event loop runs a timer due every `interval_s`.

    Anything that blocks the loop (a synchronous wait, a big file copy, an
    image decoded in a handler) delays every lane and every request; here
    it shows as lag, which `/metrics` reports as its maximum over a minute.
    """

    def __init__(self, interval_s: float = LAG_PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.window = LagWindow()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-loop lag probe")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_background(self._task)
            self._task = None

    def max_lag_s(self) -> float:
        return self.window.max_s(time.monotonic())

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            self.window.add(now, max(0.0, now - due))


class _LiveCollector(Collector):
    """Numbers that live elsewhere (store, scheduler, runners), read at scrape time."""

    def __init__(self, read: Callable[[], Mapping[str, Any]]) -> None:
        self._read = read

    def describe(self) -> Iterator[Metric]:
        # Nothing to read at registration time: the service may not be up yet.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        snap = self._read()
        tasks = GaugeMetricFamily(
            "dispatcher_tasks", "Tasks by model and state", labels=["model", "state"]
        )
        for (model, state), count in sorted(snap["state_counts"].items()):
            tasks.add_metric([model, state], count)
        yield tasks
        queued = GaugeMetricFamily(
            "dispatcher_lane_queued", "Pending tasks a lane may take", labels=["lane"]
        )
        running = GaugeMetricFamily(
            "dispatcher_lane_running", "Tasks running in a lane", labels=["lane"]
        )
        enabled = GaugeMetricFamily(
            "dispatcher_lane_enabled", "1 when the lane takes new tasks", labels=["lane"]
        )
        for lane in snap["lanes"]:
            queued.add_metric([lane["name"]], lane["queued"])
            running.add_metric([lane["name"]], len(lane["running"]))
            enabled.add_metric(
                [lane["name"]], 1 if lane["enabled"] and not lane["needs_attention"] else 0
            )
        effective = GaugeMetricFamily(
            "dispatcher_lane_effective_concurrency",
            "Tasks a lane may run at once now: its quota, halved while 429s storm",
            labels=["lane"],
        )
        account_state = GaugeMetricFamily(
            "dispatcher_account_state",
            "1 for the state each web account or API provider is in "
            "(ok, cooldown, needs_attention, disabled, unreachable)",
            labels=["account", "state"],
        )
        for lane in snap["lanes"]:
            effective.add_metric([lane["name"]], lane["effective_concurrency"])
        for account in snap.get("accounts", ()):
            for state in ("ok", "cooldown", "needs_attention", "disabled", "unreachable"):
                account_state.add_metric(
                    [account["name"], state], 1 if account["state"] == state else 0
                )
        cost = CounterMetricFamily(
            "dispatcher_cost_usd",
            "Dollars finished tasks cost, per API provider or web account",
            labels=["provider"],
        )
        for provider, usd in sorted(snap.get("cost_by_provider", {}).items()):
            cost.add_metric([provider], usd)
        yield cost
        budget = GaugeMetricFamily(
            "dispatcher_budget_usd", "A provider's daily budget (dollars)", labels=["provider"]
        )
        spent = GaugeMetricFamily(
            "dispatcher_budget_spent_usd",
            "Dollars a provider with a budget spent (or holds for running tasks) today",
            labels=["provider"],
        )
        told: set[str] = set()
        for lane in snap["lanes"]:
            view = lane.get("budget")
            if view is None or lane["owner"] in told:
                continue
            told.add(lane["owner"])
            budget.add_metric([lane["owner"]], view["daily_usd"])
            spent.add_metric([lane["owner"]], view["spent_usd"])
        yield budget
        yield spent
        yield queued
        yield running
        yield enabled
        yield effective
        yield account_state
        for name, help_text, value in (
            ("dispatcher_dedup_hits", "Submissions answered with an existing task", "dedup_hits"),
            ("dispatcher_cache_hits", "Tasks completed from the result cache", "cache_hits"),
            (
                "dispatcher_retries",
                "Attempts re-queued after a failure or by an operator",
                "retries",
            ),
            (
                "dispatcher_stale_reclaims",
                "Running tasks reclaimed for lack of heartbeat",
                "stale_reclaims",
            ),
            (
                "dispatcher_late_beats",
                "Own live runs found stale in the store (this host's loop or database slow), "
                "left running, not reclaimed",
                "late_beats",
            ),
            (
                "dispatcher_stalled_reclaims",
                "Web attempts whose answer stopped changing for stall_s while the page was busy",
                "stalled_reclaims",
            ),
            (
                "dispatcher_browser_launches",
                "Browsers started by the web runner",
                "browser_launches",
            ),
            (
                "dispatcher_browser_reuses",
                "Web tasks run in the browser kept open from the account's previous task",
                "browser_reuses",
            ),
            (
                "dispatcher_browser_prestarts",
                "Browsers started and kept ready before their account's first task",
                "browser_prestarts",
            ),
            (
                "dispatcher_browsers_closed_for_memory",
                "Idle kept browsers closed to make room within the browser memory budget",
                "browsers_closed_for_memory",
            ),
            (
                "dispatcher_leftover_processes_ended",
                "Leftover browser processes ended by the self-check",
                "leftovers_ended",
            ),
        ):
            family = CounterMetricFamily(name, help_text)
            family.add_metric([], snap["counters"].get(value, 0))
            yield family
        remote = CounterMetricFamily(
            "dispatcher_remote_requests",
            "HTTP requests to API providers",
            labels=["provider", "status"],
        )
        for (provider, status), count in sorted(snap["remote_requests"].items()):
            remote.add_metric([provider, str(status)], count)
        yield remote
        yield from _memory_families(snap.get("memory", []))
        lag = GaugeMetricFamily(
            "dispatcher_event_loop_lag_seconds",
            "Largest delay of the event loop over the last minute (anything blocking it "
            "delays every lane)",
        )
        lag.add_metric([], snap.get("event_loop_lag_s", 0.0))
        yield lag


def _memory_families(views: Iterable[MemoryView]) -> Iterator[Metric]:
    """The browser memory budget, the service's own footprint, each open browser's."""
    budget = GaugeMetricFamily(
        "dispatcher_browser_memory_budget_bytes",
        "Memory the service and its browsers may hold on this host (browser_memory_mb)",
    )
    service = GaugeMetricFamily(
        "dispatcher_service_memory_bytes",
        "PSS of the service's own processes (Python, the Playwright driver)",
    )
    browsers = GaugeMetricFamily(
        "dispatcher_browser_memory_bytes",
        "PSS of a web account's open browser (its process tree)",
        labels=["owner"],
    )
    for view in views:
        budget.add_metric([], view.budget_bytes)
        service.add_metric([], view.service_bytes)
        for owner, size in sorted(view.browsers.items()):
            browsers.add_metric([owner], size)
    yield budget
    yield service
    yield browsers


_M = TypeVar("_M", Counter, Histogram)


class Metrics:
    def __init__(self, read_live: Callable[[], Mapping[str, Any]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_LiveCollector(read_live))
        self.task_duration = Histogram(
            "dispatcher_task_duration_seconds",
            "Run time of finished tasks by model",
            ["model"],
            buckets=_DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.stage_duration = Histogram(
            "dispatcher_stage_duration_seconds",
            "Time spent per stage by model",
            ["model", "stage"],
            buckets=_DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.finished = Counter(
            "dispatcher_tasks_finished",
            "Tasks that reached a terminal state",
            ["model", "state"],
            registry=self.registry,
        )
        self.webhook_deliveries = Counter(
            "dispatcher_webhook_deliveries",
            "Webhook delivery attempts by result: delivered, retry (due again later), "
            "failed (given up; kept for redelivery)",
            ["result"],
            registry=self.registry,
        )
        self.webhook_dropped = Counter(
            "dispatcher_webhook_dropped",
            "Webhook deliveries that will not reach their receiver unless redelivered "
            "(given up, or never written: queue full, store down)",
            registry=self.registry,
        )
        # The labelled children of the metrics above (`_child`): as many as
        # models x states and stages, which the profiles bound.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def on_event(self, event: Event) -> None:
        match event:
            case TaskChanged(task=task, origin=None) if task.is_terminal:
                self._finished(task)

    def _finished(self, task: Task) -> None:
        self._child(self.finished, task.model, task.state.value).inc()
        if task.state is State.SUCCESS and not task.from_cache and task.started_at:
            self._child(self.task_duration, task.model).observe(
                max(0.0, (task.finished_at or task.started_at) - task.started_at)
            )
        for stage, seconds in task.stage_durations.items():
            self._child(self.stage_duration, task.model, stage).observe(max(0.0, seconds))

    def _child(self, metric: _M, *labels: str) -> _M:
        """`metric.labels(*labels)`, looked up once: `labels` checks and
        locks on every call, and every finished task makes several."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return cast(_M, child)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE


async def live_numbers(
    store: Store,
    ledger: Ledger,
    scheduler: Scheduler,
    accounts: AccountBook,
    runners: Iterable[Runner],
    lag_probe: LoopLagProbe,
) -> dict[str, Any]:
    """What a scrape reads: task counts, lanes, accounts, counters, remote calls, lag."""
    counters: dict[str, int] = {
        "dedup_hits": ledger.dedup_hits,
        "cache_hits": ledger.cache_hits,
        "retries": ledger.retries,
        "stale_reclaims": ledger.stale_reclaims,
        "stalled_reclaims": scheduler.stalled_reclaims,
        "late_beats": scheduler.late_beats,
    }
    remote: dict[tuple[str, str], int] = {}
    runners = list(runners)
    memory = [await runner.memory_view() for runner in runners]
    for runner in runners:
        stats = runner.stats()
        remote.update(stats.remote_requests)
        for key, value in stats.counters.items():
            counters[key] = counters.get(key, 0) + value
    return {
        "state_counts": await store.state_counts(),
        "cost_by_provider": await store.cost_by_provider(),
        "lanes": await scheduler.lanes_view(),
        "accounts": accounts.views(),
        "counters": counters,
        "remote_requests": remote,
        "event_loop_lag_s": lag_probe.max_lag_s(),
        "memory": [view for view in memory if view is not None],
    }
