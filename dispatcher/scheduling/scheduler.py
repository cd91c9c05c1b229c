"""The lanes' engine: reclaim stale work, start the oldest pending task per free slot.

Each round first reclaims running tasks whose heartbeat is older than the
stale bound, then, lane by lane, claims the oldest pending task (the claim
marks it running) and only then starts it. Every lane's tasks run as their
own asyncio tasks, so a six-minute web generation never delays an API task.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from dispatcher.accounts.failures import AccountHealth
from dispatcher.accounts.health import DEFAULT_FAILURES_FOR_ATTENTION
from dispatcher.accounts.switches import UNREACHABLE_PROBE_S, AccountBook
from dispatcher.background import stop_background
from dispatcher.clock import Clock
from dispatcher.errors import (
    RunError,
    StateConflict,
)
from dispatcher.events import AccountChanged, Event, TaskChanged, TaskNoticed
from dispatcher.models import JSON, Kind, Stage, State, Task
from dispatcher.profiles import Profile
from dispatcher.scheduling.allowances import AllowanceBook
from dispatcher.scheduling.beats import HeartbeatBatch, keep_beating, next_beat_in_s
from dispatcher.scheduling.budgets import BudgetBook
from dispatcher.scheduling.claimed import ready_to_start
from dispatcher.scheduling.decisions import (
    HEARTBEAT_INTERVAL_S,
    STALE_AFTER_S,
    LaneSnapshot,
    free_slots,
)
from dispatcher.scheduling.fallbacks import fill_preferring
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.scheduling.laneviews import QueuedCounts, lanes_view, task_progress
from dispatcher.scheduling.outcomes import record_outcome, run_outcome
from dispatcher.scheduling.protocol import Interruption, RunContext, Runner
from dispatcher.scheduling.remotewake import RemoteWakes
from dispatcher.scheduling.roundwait import RoundWaiters
from dispatcher.scheduling.running import (
    Live,
    Outcome,
    Running,
    TaskLog,
)
from dispatcher.scheduling.runtimes import RunHistory, polls
from dispatcher.scheduling.stalelook import reclaim_stale
from dispatcher.scheduling.withend import ClaimWithEnd, claim_with_end
from dispatcher.scheduling.withinsert import claim_with_insert
from dispatcher.store.hosts import Fence, Quota
from dispatcher.tasks.ledger import Ledger

log = logging.getLogger("dispatcher.scheduling.scheduler")

# A lane and its concurrency -> the lease a claim proves and the global quota
# it respects (`hostwatch.claim_guard`).
ClaimGuard = Callable[[LaneSpec, int], tuple[Fence | None, Quota | None]]

RECENT_RUNS = 20  # run times per model behind an ETA
# How often a round looks for stale running tasks (nominal seconds, scaled
# like the heartbeat): stale means `STALE_AFTER_S` (90 s) without a beat, so
# a look every 5 s finds one at most 5 s later, and on PostgreSQL it saves a
# query every tick (0.5 s).
STALE_LOOK_S = 5.0


class Scheduler:
    def __init__(
        self,
        *,
        ledger: Ledger,
        clock: Clock,
        lanes: Mapping[str, LaneSpec],
        runners: Mapping[Kind, Runner],
        accounts: AccountBook,
        profiles: Mapping[str, Profile],
        results_dir: Path,
        failures_for_attention: int = DEFAULT_FAILURES_FOR_ATTENTION,
        effective_concurrency: Callable[[LaneSpec], int] | None = None,
        claim_guard: ClaimGuard | None = None,
        shared_queues: bool = False,
        budgets: BudgetBook | None = None,
        allowances: AllowanceBook | None = None,
    ) -> None:
        self.ledger = ledger
        self.clock = clock
        self.lanes = dict(lanes)
        self.runners = dict(runners)
        self.accounts = accounts
        self.profiles = profiles
        self.results_dir = results_dir
        self.running: dict[str, Running] = {}
        self._lane_running: dict[str, set[str]] = {name: set() for name in self.lanes}
        self._wake = asyncio.Event()
        self._idle: dict[str, asyncio.Event] = {}  # lane -> set when it runs nothing
        # One fill per lane at a time: a claim is an await, and two fills of a
        # lane (a round and a refill) must not both count the same free slot.
        self._filling: dict[str, asyncio.Lock] = {}
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self._next_reclaim = float("-inf")
        # Recent run times per model for ETAs: read from the store once, then
        # kept here, because every task answer needs them.
        self._durations: dict[str, deque[float]] = {}
        self.run_history = RunHistory()
        self.round_waiters = RoundWaiters()
        self.health = AccountHealth(ledger, clock, accounts, failures_for_attention)
        # A lane's concurrency after 429 storms (`health.after_call`); None: its quota.
        self.effective_concurrency = effective_concurrency
        # What a claim proves in the store across hosts (a lease, a quota).
        self.claim_guard = claim_guard
        # Other hosts serve the same queues (PostgreSQL): an ETA counts their
        # lanes busy on a queue too, as the database shows them.
        self.shared_queues = shared_queues
        # Providers' daily budgets (issue 30): checked in the claim; said here.
        self.budgets = budgets
        # Web accounts' daily allowances (issue 30): checked before a claim.
        self.allowances = allowances
        self._cooldown_timer: asyncio.TimerHandle | None = None
        self.stalled_reclaims = 0  # web attempts the progress watchdog ended
        # Own live runs found stale in the store, left running (`stalelook`).
        self.late_beats = 0
        # The lanes view's queue counts, read again after a task changed.
        self.queued = QueuedCounts(ledger.queued_counts)
        # The running tasks' beats, due together, written together (`beats`).
        self.beats = HeartbeatBatch(lambda due: self.ledger.heartbeats(due))
        # Other hosts' new tasks wake this one a grace later, unless claimed
        # meanwhile (`remotewake`): their own host claims them first.
        self.remote_wakes = RemoteWakes(clock, self.wake)
        # Handlers only call the ledger; what it announces tells us what to do.
        ledger.events.listen(self._on_event)
        # A submit's insert may carry a lane's claim (`withinsert`).
        ledger.insert_claims = self

    # -- timing ----------------------------------------------------------------
    @property
    def heartbeat_s(self) -> float:
        return self.clock.scaled(HEARTBEAT_INTERVAL_S)

    @property
    def stale_s(self) -> float:
        return self.clock.scaled(STALE_AFTER_S)

    @property
    def stale_look_s(self) -> float:
        return self.clock.scaled(STALE_LOOK_S)

    @property
    def tick_s(self) -> float:
        # Often enough to notice retry delays expiring and stale tasks promptly.
        return min(0.5, self.heartbeat_s / 3)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="scheduler")

    def wake(self) -> None:
        self._wake.set()

    async def started_what_it_can(self, timeout_s: float) -> None:
        """After work was queued: until a round begun now has claimed and
        started what it could (`roundwait.py`), at most `timeout_s`."""
        if self._loop_task is None or self._loop_task.done() or self._stopping:
            return
        self._wake.set()
        await self.round_waiters.next_round(timeout_s)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self.round_waiters.begin()
            try:
                await self.round()
            except Exception:
                # A failing round (e.g. a locked database) must not kill the lanes.
                log.exception("scheduler round failed; retrying next tick")
            self.round_waiters.ended()
            # The tick is a timer that sets the wake event, not a wait_for:
            # rounds follow every submit and every finished task, and a
            # wait_for costs a new task per round.
            tick = loop.call_later(self.tick_s, self._wake.set)
            await self._wake.wait()
            tick.cancel()
            self._wake.clear()

    async def shutdown(self) -> None:
        """Stop starting work; stop running tasks at their checkpoints, recoverable."""
        self._stopping = True
        self._wake.set()
        self.remote_wakes.close()
        if self._loop_task is not None:
            await self._loop_task
        works = []
        for running in list(self.running.values()):
            work = running.ctx.work
            if work is not None and not work.done():
                running.ctx.interrupt(Interruption.SHUTDOWN)
                works.append(work)
        if works:
            await asyncio.gather(*works, return_exceptions=True)
        await self.beats.aclose()

    def lane_tasks(self, name: str) -> list[str]:
        """Ids of the tasks running in a lane (also one dropped from `lanes`)."""
        return sorted(self._lane_running.get(name, ()))

    async def wait_lane_idle(self, name: str) -> None:
        """Until the lane runs nothing (its last task's runner has returned)."""
        while self._lane_running.get(name):
            await self._idle.setdefault(name, asyncio.Event()).wait()

    def replace_lanes(self, lanes: Mapping[str, LaneSpec]) -> None:
        """New lanes after a reload; a dropped lane's running tasks finish undisturbed."""
        self.lanes = dict(lanes)
        for name in self.lanes:
            self._lane_running.setdefault(name, set())
        self.wake()

    # -- the round ---------------------------------------------------------------
    async def round(self) -> None:
        # Staleness is a matter of tens of seconds: a look every few seconds
        # is as prompt as one at every wake, and a query cheaper per task.
        now = self.clock.monotonic()
        if now >= self._next_reclaim:
            self._next_reclaim = now + self.stale_look_s
            await reclaim_stale(self)
        if self._stopping:
            return
        await self.accounts.refresh()
        lanes = list(self.lanes.values())
        if len(lanes) > 1 and await self.ledger.fallbacks_waiting():
            await fill_preferring(self, lanes)
        else:
            for lane in lanes:
                await self.fill(lane)
        self._wake_at_cooldown_end()

    def _wake_at_cooldown_end(self) -> None:
        """A cooling-down account opens by itself: a round is due at that instant."""
        openings = [self.accounts.next_opening()]
        if self.allowances is not None:
            openings.append(self.allowances.next_opening())  # a used-up account's reset
        opening = min((at for at in openings if at is not None), default=None)
        if self._cooldown_timer is not None:
            self._cooldown_timer.cancel()
            self._cooldown_timer = None
        if opening is not None:
            delay_s = max(0.0, opening - self.clock.now()) + 0.001
            self._cooldown_timer = asyncio.get_running_loop().call_later(delay_s, self.wake)

    def lane_concurrency(self, lane: LaneSpec) -> int:
        """The lane's quota, halved while 429s storm (never below 1)."""
        if self.effective_concurrency is None:
            return lane.concurrency
        return max(1, min(lane.concurrency, self.effective_concurrency(lane)))

    async def fill(self, lane: LaneSpec, prefer: tuple[str, ...] = ()) -> None:
        """Claim and start the lane's oldest ready tasks, one per free slot."""
        current = self.lanes.get(lane.name)
        if current is None:
            # Dropped since `lane` was read (a finished task's refill, a round
            # begun before an account's removal): a drained account takes no
            # new task, or the next pending one kept it busy.
            return
        lane = current
        async with self.fill_lock(lane.name):
            await self._fill_slots(lane, prefer)

    def fill_lock(self, name: str) -> asyncio.Lock:
        # Uncontended (always, on SQLite) the lock is taken without a yield.
        lock = self._filling.get(name)
        if lock is None:
            lock = self._filling[name] = asyncio.Lock()
        return lock

    def snapshot(self, lane: LaneSpec) -> LaneSnapshot:
        return LaneSnapshot(
            name=lane.name,
            concurrency=self.lane_concurrency(lane),
            enabled=self.accounts.is_open(lane.owner),
            running=len(self._lane_running.get(lane.name, ())),
        )

    async def _fill_slots(self, lane: LaneSpec, prefer: tuple[str, ...]) -> None:
        snapshot = self.snapshot(lane)
        slots = free_slots(snapshot)
        # An allowance is counted in the store since the account's reset:
        # serial per account (one slot, and across hosts one lease holder).
        allowances = self.allowances
        if slots and allowances and await allowances.used_up(lane.owner, self.clock.now()):
            slots = 0
        fence, quota = (
            self.claim_guard(lane, snapshot.concurrency)
            if slots and self.claim_guard is not None
            else (None, None)
        )
        budget = self.budgets.guard(lane.owner, self.clock.now()) if self.budgets else None
        for _ in range(slots):
            task = await self.ledger.claim(
                lane.queues, lane.owner, fence=fence, quota=quota, budget=budget, prefer=prefer
            )
            if budget is not None and self.budgets is not None:
                await self.budgets.after_claim(lane, task, self.clock.now())
            if task is None:
                break
            ready = await ready_to_start(self, task, lane)
            if ready is not None:
                self._start(ready, lane)

    # -- running one task ----------------------------------------------------------
    def lane_for(self, task: Task) -> LaneSpec | None:
        for lane in self.lanes.values():
            if task.owner == lane.owner and task.queue in lane.queues:
                return lane
        return None

    def _reachability(self, owner: str, problem: str | None) -> None:
        if problem is None:
            self.accounts.mark_reachable(owner)
        else:
            self.accounts.mark_unreachable(owner, problem, self.clock.scaled(UNREACHABLE_PROBE_S))

    async def adopt(self, task: Task) -> bool:
        """Resume a task a previous run (or a dead host) left running: an API job
        with a remote id, polled here from now on."""
        lane = self.lane_for(task)
        if lane is None:
            return False
        # Its last heartbeat is as old as our downtime; without a fresh one the
        # first round would reclaim the very task we are resuming.
        refreshed = await self.ledger.adopt(task)
        if refreshed is None:
            return False
        self._start(refreshed, lane)
        return True

    def _start(self, task: Task, lane: LaneSpec) -> None:
        profile = self.profiles[task.model]
        now = self.clock.now()
        live = Live(stage=task.stage or Stage.DISPATCHED, stage_started=now)

        async def report_stage(stage: Stage, progress: float | None, queue: int | None) -> None:
            live.enter(stage, self.clock.now())
            live.progress = progress
            live.queue_position = queue
            if progress is not None and live.progress_since is None:
                live.progress_since = self.clock.now()

        adapter = TaskLog(
            logging.getLogger(f"dispatcher.lane.{lane.name}"),
            {"lane": lane.name, "task_id": task.id, "attempt": task.attempt},
        )
        ctx = RunContext(
            task=task,
            profile=profile,
            lane=lane.name,
            owner=lane.owner,
            clock=self.clock,
            result_dir=self.results_dir.joinpath(task.id, f"attempt-{task.attempt}"),
            log=adapter,
            report_stage=report_stage,
            record_remote_id=functools.partial(self._record_remote_id, task.id),
            history_s=self.run_history.durations(task.model, task.params) if polls(profile) else (),
            reachability=functools.partial(self._reachability, lane.owner),
        )
        running = Running(
            task=task, lane=lane, ctx=ctx, live=live, started_monotonic=ctx.last_beat_monotonic
        )
        self.running[task.id] = running
        self._lane_running[lane.name].add(task.id)
        ctx.work = asyncio.create_task(self._execute(running), name=f"task-{task.id}")
        if task.cancel_requested:
            ctx.interrupt(Interruption.CANCELED)

    async def _record_remote_id(self, task_id: str, remote_id: str) -> None:
        """What a run reports through `ctx.set_remote_id` (it runs only once registered)."""
        running = self.running.get(task_id)
        if running is None:  # reclaimed meanwhile: the run is told to stop, not a KeyError
            raise StateConflict(f"task {task_id} was reclaimed before its remote id was stored")
        running.task = await self.ledger.record_remote_id(running.task, remote_id)

    async def _execute(self, running: Running) -> None:
        runner = self.runners[running.lane.kind]
        # The heartbeat loop starts when the first beat is due: most API tasks
        # are over long before, and a timer costs less than a task per run.
        beats: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        first_beat = loop.call_later(
            next_beat_in_s(loop.time(), self.heartbeat_s),
            lambda: beats.append(asyncio.create_task(keep_beating(self, running, runner))),
        )
        succeeded: Task | None = None
        try:
            try:
                outcome = await run_outcome(self, running, runner)
            finally:
                first_beat.cancel()
                # Unregistered first: a heartbeat loop that missed its cancel
                # (see dispatcher.background) ends at its next turn all the same.
                self.running.pop(running.task.id, None)
                for beat in beats:
                    # A reclaim or shutdown arriving meanwhile must not skip
                    # the outcome's write below.
                    with contextlib.suppress(asyncio.CancelledError):
                        await stop_background(beat)
            if outcome is not None:
                # The outcome's write is an await (a round trip on PostgreSQL):
                # a reclaim or shutdown cancelling us meanwhile must not lose
                # it, nor the next task claimed with it.
                succeeded = await asyncio.shield(self._end_run(running, outcome))
        finally:
            # The slot is given back once the outcome is on record, so that a
            # lane's runs never appear to overlap (a web account runs one at
            # a time): a round in between would start the next one early.
            self._release_slot(running)
            await self._refill(running.lane)
        if succeeded is not None:
            # After the refill: linking a video into the cache is a thread's
            # file work, which a busy disk or two busy cores can stretch to
            # tens of ms, and the lane's next task need not wait for it.
            await self._keep_in_cache(succeeded)

    async def _end_run(self, running: Running, outcome: Outcome) -> Task | None:
        """The outcome on record, with the lane's next claim when it rides
        along (`withend`); the task it claimed started in the freed slot.
        The task as written when it succeeded, else None."""
        lane = self.lanes.get(running.lane.name)
        failed = isinstance(outcome, RunError)
        with_end = None if lane is None else self.carried_claim(lane, failed=failed)
        succeeded = await record_outcome(self, running, outcome, with_end)
        if with_end is not None and with_end.claimed is not None:
            await self._start_claimed(running, with_end.claimed)
        return succeeded

    async def _keep_in_cache(self, succeeded: Task) -> None:
        try:
            await asyncio.shield(self.ledger.keep_in_cache(succeeded))
        except Exception:  # a cancel (shutdown) is not one: it goes on up
            # The result is on record; only an identical task's cache hit is lost.
            log.exception("task %s: keeping its result in the cache failed", succeeded.id)

    def claim_with(self, task: Task) -> AbstractAsyncContextManager[ClaimWithEnd | None]:
        """A submit's insert carries its lane's claim (`withinsert`)."""
        return claim_with_insert(self, task)

    def carried_claim(
        self, lane: LaneSpec, *, failed: bool = False, freeing: bool = True
    ) -> ClaimWithEnd | None:
        """The claim a write carries for `lane` (`withend`): a run's end
        (`freeing`: the ending run still holds its slot), or a submit's insert."""
        snapshot = self.snapshot(lane)
        fence, quota = (
            self.claim_guard(lane, snapshot.concurrency)
            if self.claim_guard is not None
            else (None, None)
        )
        budgets = self.budgets
        budgeted = budgets is not None and budgets.guard(lane.owner, self.clock.now()) is not None
        return claim_with_end(
            lane,
            snapshot,
            fence=fence,
            quota=quota,
            budgeted=budgeted,
            stopping=self._stopping,
            failed=failed,
            freeing=freeing,
        )

    async def _start_claimed(self, running: Running, task: Task) -> None:
        """Start a task claimed with `running`'s end, as a refill would start
        it, in the slot `running` gives back; given back when the lane is gone
        or the scheduler stopping."""
        name = running.lane.name
        if name not in self.lanes or self._stopping:
            self._release_slot(running)
            await self.start_claimed_in(name, task)  # given back
            return
        async with self.fill_lock(name):
            self._release_slot(running)
            await self.start_claimed_in(name, task)

    async def start_claimed_in(self, lane_name: str, task: Task) -> None:
        """Start a task claimed for the lane outside a round (with a run's end,
        with a submit's insert: `withinsert`), the lane's fill lock held, as a
        refill starts one; given back (pending, same attempt) when the lane
        is gone or the scheduler stopping."""
        lane = self.lanes.get(lane_name)
        try:
            if lane is None or self._stopping:
                await self.ledger.requeue(task, "claimed as its lane stopped taking tasks")
                return
            ready = await ready_to_start(self, task, lane)
            if ready is not None:
                self._start(ready, lane)
        except Exception:
            self.start_failed(lane_name, "starting the next task")

    def _release_slot(self, running: Running) -> None:
        lane_running = self._lane_running[running.lane.name]
        lane_running.discard(running.task.id)
        if not lane_running:
            idle = self._idle.pop(running.lane.name, None)
            if idle is not None:
                idle.set()

    async def _refill(self, lane: LaneSpec) -> None:
        """The slot just freed takes the lane's next task at once: waiting for
        the scheduler's round costs a turn of the event loop, which is long
        while a burst of submissions is being answered."""
        if self._stopping:
            return
        try:
            await self.fill(lane)
        except Exception:
            self.start_failed(lane.name, "starting the next task")

    def start_failed(self, lane_name: str, what: str) -> None:
        """In an `except` block: a start that raised, logged with its
        traceback; the next round retries."""
        log.exception(
            "%s: %s failed; the next round retries", lane_name, what, extra={"lane": lane_name}
        )
        self.wake()

    # -- what the scheduler hears ---------------------------------------------------
    def _on_event(self, event: Event) -> None:
        """A task became pending or an account changed: a round may start
        work (another host's task: after a grace, unless claimed meanwhile,
        `remotewake`). A cancel was asked for a running task: its runner is
        told. Any task change: the queue counts are read again."""
        match event:
            case AccountChanged():
                self.wake()
            case TaskChanged(task=task, origin=origin):
                self._task_changed(task.id, task.state, task.cancel_requested, origin)
            case TaskNoticed():
                self._task_changed(event.task_id, event.state, event.cancel_requested, event.origin)

    def _task_changed(
        self, task_id: str, state: State, cancel_requested: bool, origin: str | None
    ) -> None:
        self.queued.changed()
        if state is State.PENDING:
            if origin:
                self.remote_wakes.heard_pending(task_id)
            else:
                self.wake()
            return
        self.remote_wakes.left(task_id)
        if state is State.RUNNING and cancel_requested:
            running = self.running.get(task_id)
            if running is not None:
                running.ctx.interrupt(Interruption.CANCELED)

    async def progress(self, task: Task) -> JSON:
        """`ahead`, `eta_s` and live progress for a task answer (`laneviews`)."""
        return await task_progress(self, task)

    async def recent_durations(self, model: str) -> deque[float]:
        if model not in self._durations:
            self._durations[model] = deque(
                await self.ledger.recent_durations(model, RECENT_RUNS), maxlen=RECENT_RUNS
            )
        return self._durations[model]

    async def lanes_view(self) -> list[JSON]:
        return await lanes_view(self)
