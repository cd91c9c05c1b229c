"""The one small interface every runner implements, and what it is handed.

A runner turns one claimed task into a `RunResult` or raises:
`TaskCanceled` when a cancel ended one of its guarded waits (`RunContext.guard`)
or met a checkpoint (`check_canceled`), a `RunError` (transient or permanent)
when the attempt failed. It never writes task state itself: the scheduler
owns every state write; the runner reports through its `RunContext`
(liveness, stage, the remote id). A reclaim or a shutdown reaches the run as
an asyncio cancellation (`RunContext.interrupt`), and its ending is not
recorded.

A cancel can be lost: on Python 3.11 `asyncio.wait_for` returns its inner
result, and swallows the cancel, when the inner wait completes in the turn
the cancel arrives (see `dispatcher.background`), and runners wait through
libraries that wait that way. So the context remembers a reclaim or a
shutdown: a guard entered afterwards raises CancelledError at once, one in
progress raises it instead of returning, and one still waiting is cancelled
again every `RECANCEL_S` until it has ended. The run's own cleanup (outside
any guard) is never cancelled twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, TypeVar

from dispatcher.background import RECANCEL_S
from dispatcher.clock import Clock
from dispatcher.errors import TaskCanceled, TransientError
from dispatcher.models import JSON, Stage, Task
from dispatcher.profiles import Profile
from dispatcher.settings import Settings


@dataclass(frozen=True)
class ResultFile:
    path: str  # absolute path on disk
    name: str
    size: int
    content_type: str
    sha256: str

    def to_json(self) -> JSON:
        return {
            "path": self.path,
            "name": self.name,
            "size": self.size,
            "content_type": self.content_type,
            "sha256": self.sha256,
        }


@dataclass
class RunResult:
    text: str | None = None
    files: list[ResultFile] = field(default_factory=list)
    meta: JSON = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {
            "text": self.text,
            "files": [f.to_json() for f in self.files],
            "meta": self.meta,
        }


StageReporter = Callable[[Stage, float | None, int | None], Awaitable[None]]
RemoteIdRecorder = Callable[[str], Awaitable[None]]
T = TypeVar("T")


def timed_out(budget_s: float, what: str, label: str | None = None) -> TransientError:
    """What a guarded wait raises when its budget ran out first."""
    return TransientError(
        f"timed out after {label or f'{budget_s:g} s'} while {what}", kind="timeout"
    )


class Interruption(Enum):
    """Why a run was told to stop before it ended by itself."""

    # An operator asked to cancel: guarded waits end at once with
    # TaskCanceled, the runner cleans up, the task ends canceled.
    CANCELED = "canceled"
    # The scheduler took the task back as stale: the run is cancelled as an
    # asyncio task and writes no verdict (another attempt follows).
    RECLAIMED = "reclaimed"
    # The service is stopping: cancelled as an asyncio task, no verdict; the
    # task is requeued or, with a remote job, resumed at the next start.
    SHUTDOWN = "shutdown"

    @property
    def withdraws(self) -> bool:
        """The scheduler took the run back: whatever it ends with is not recorded."""
        return self is not Interruption.CANCELED


class RunContext:
    """What a runner may see and do while it runs one attempt of one task.

    Cancel has one path: the scheduler calls `interrupt`; a runner awaits
    everything that may take long through `guard`, and checks
    `check_canceled` between steps.
    """

    def __init__(
        self,
        *,
        task: Task,
        profile: Profile,
        lane: str,
        owner: str,
        clock: Clock,
        result_dir: Path,
        log: logging.LoggerAdapter[Any],
        report_stage: StageReporter,
        record_remote_id: RemoteIdRecorder,
        history_s: tuple[float, ...] = (),
        reachability: Callable[[str | None], None] | None = None,
    ) -> None:
        self.task = task
        # Tells the lane's provider whether its server answers (None: it
        # does; a text: it refuses connections, and why).
        self._reachability = reachability
        # Nominal run times of recent jobs of the same model and shape
        # (`dispatcher.scheduling.runtimes`): where an async job's poll expects its end.
        self.history_s = history_s
        self.profile = profile
        self.lane = lane
        # The web account or API provider whose lane runs this attempt.
        self.owner = owner
        self.clock = clock
        self.result_dir = result_dir
        self.log = log
        self.interruption: Interruption | None = None
        # The asyncio task the whole run executes in (set by the scheduler):
        # what a reclaim or a shutdown cancels.
        self.work: asyncio.Task[Any] | None = None
        self._last_beat_monotonic = clock.monotonic()
        self._alive_waits = 0  # guards whose waiting itself proves liveness
        # Tasks inside `guard` (with its nesting depth), and those we cut.
        self._guarded: dict[asyncio.Task[Any], int] = {}
        self._cut: set[asyncio.Task[Any]] = set()
        self._report_stage = report_stage
        self._record_remote_id = record_remote_id
        # The remote side's own estimate (seconds left, when it said so), for
        # a server that keeps its own queue (a gradio app): better than ours.
        self._remote_eta: tuple[float, float] | None = None
        # What the stage is doing right now, in a few words ("node 3
        # (KSampler)", "queued on server, 2 ahead", "waiting for the
        # server"); shown beside the stage, set with each `set_stage`.
        self.stage_detail: str | None = None

    # -- interruption ------------------------------------------------------

    @property
    def canceled(self) -> bool:
        return self.interruption is Interruption.CANCELED

    def interrupt(self, reason: Interruption) -> None:
        """Stop the run: see `Interruption` for what each reason does.

        A reclaim or a shutdown overrides a cancel (neither writes a verdict);
        a cancel after them changes nothing.
        """
        if reason is Interruption.CANCELED:
            if self.interruption is not None:
                return
            self.interruption = reason
            current = asyncio.current_task()
            for task in self._guarded:
                # The caller's own task notices at its next guard or checkpoint:
                # cancelling itself would leave a cancel pending past the guard.
                if task is not current and task not in self._cut and not task.done():
                    self._cut.add(task)
                    task.cancel()
            return
        first = self.interruption is None or not self.interruption.withdraws
        self.interruption = reason
        if self.work is not None and not self.work.done():
            self.work.cancel()
        if first:
            asyncio.get_running_loop().call_later(RECANCEL_S, self._recancel)

    @property
    def withdrawn(self) -> bool:
        """A reclaim or a shutdown has stopped the run: no guard returns from now on."""
        return self.interruption is not None and self.interruption.withdraws

    def _recancel(self) -> None:
        """Cancel again whatever still waits in a guard since the run was withdrawn.

        No guard can start once the run is withdrawn, so each of these was
        waiting when the cancel came, and is waiting still: its cancel was
        lost (or its work swallowed it). A cancel that was delivered has been
        handled by now (its wake-up runs in the loop's next turn, long before
        this timer), so this never cancels twice what is already unwinding.
        """
        waiting = [task for task in self._guarded if not task.done()]
        for task in waiting:
            task.cancel()
        if waiting:
            asyncio.get_running_loop().call_later(RECANCEL_S, self._recancel)

    def check_canceled(self) -> None:
        """A checkpoint: raise TaskCanceled once an operator has asked to cancel."""
        if self.canceled:
            raise TaskCanceled(f"task {self.task.id} canceled")

    async def guard(
        self,
        work: Awaitable[T],
        budget_s: float | None = None,
        *,
        what: str = "waiting",
        budget_label: str | None = None,
        alive: bool = False,
    ) -> T:
        """Await `work` in the calling task; a cancel or the budget ends it at once.

        Raises TaskCanceled when an operator cancels (before or while it
        runs), and TransientError(kind="timeout") "timed out after
        <budget_label> while <what>" when `budget_s` real seconds pass
        first. A reclaim or a shutdown raises CancelledError: before the work
        starts, while it runs, and when it returns or fails after losing
        that cancel (no verdict is recorded, so its result has no use). Work
        that swallows an operator's cancel and returns keeps its result (a
        write it finished is not lost); the next guard or checkpoint raises.
        Guards nest, in one task or across tasks (`asyncio.gather`).

        The run beats once the work has returned; `alive` says the wait
        itself proves liveness (a step bounded by its own timeout that does
        not depend on a page: a launch, a download), so it counts as beating.
        """
        if self.withdrawn:
            _close(work)
            raise self._withdrawn_error()
        if self.canceled:
            _close(work)
            raise TaskCanceled(f"task {self.task.id} canceled")
        if budget_s is not None and budget_s <= 0:
            _close(work)
            raise timed_out(budget_s, what, budget_label)
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("RunContext.guard must run inside a task")
        depth = self._guarded.get(task, 0)
        self._guarded[task] = depth + 1
        self._alive_waits += alive
        timeout = asyncio.timeout(budget_s)
        try:
            async with timeout:
                result = await work
        except asyncio.CancelledError:
            if task in self._cut:
                self._cut.discard(task)
                # Ours alone (and no reclaim or shutdown since): the work was unwound.
                if task.uncancel() == 0 and not self.withdrawn:
                    raise TaskCanceled(f"task {self.task.id} canceled") from None
            raise
        except Exception as exc:
            if self.withdrawn:
                raise self._withdrawn_error() from exc
            if isinstance(exc, TimeoutError) and timeout.expired():
                assert budget_s is not None
                raise timed_out(budget_s, what, budget_label) from None
            raise
        finally:
            self._alive_waits -= alive
            if depth:
                self._guarded[task] = depth
            else:
                del self._guarded[task]
            if task in self._cut:
                # The work swallowed our interrupt: take it back, or the next
                # `asyncio.timeout` in this task would count it as another's.
                self._cut.discard(task)
                task.uncancel()
        if self.withdrawn:
            raise self._withdrawn_error()
        self.beat()
        return result

    def _withdrawn_error(self) -> asyncio.CancelledError:
        return asyncio.CancelledError(f"task {self.task.id}: {self.interruption}")

    # -- liveness and progress ---------------------------------------------

    @property
    def last_beat_monotonic(self) -> float:
        """When the run last proved alive; now, while an `alive` guard waits."""
        if self._alive_waits:
            return self.clock.monotonic()
        return self._last_beat_monotonic

    def beat(self) -> None:
        """Say "still alive"; the scheduler persists a heartbeat at most every 15 s."""
        self._last_beat_monotonic = self.clock.monotonic()

    @contextlib.contextmanager
    def alive(self) -> Iterator[None]:
        """The run's own cleanup once its outcome is known (evidence, a browser's
        close), bounded by its own timeouts: it counts as beating. Otherwise a
        cleanup that outlasts the stale bound (seconds on a busy machine, with
        a time scale) got the task reclaimed as stale, an attempt charged for
        what the outcome would not charge (a logout, a usage cap)."""
        self._alive_waits += 1
        try:
            yield
        finally:
            self._alive_waits -= 1

    async def set_stage(
        self,
        stage: Stage,
        progress: float | None = None,
        queue_position: int | None = None,
        *,
        detail: str | None = None,
    ) -> None:
        self.beat()
        self.stage_detail = detail[:200] if detail else None
        await self._report_stage(stage, progress, queue_position)

    def set_remote_eta(self, eta_s: float | None) -> None:
        """The remote side's estimate of the seconds left; None: it has none."""
        self._remote_eta = None if eta_s is None else (eta_s, self.clock.now())

    def remote_eta_s(self) -> float | None:
        """Seconds left by the remote side's last estimate, counted down since."""
        if self._remote_eta is None:
            return None
        eta_s, said_at = self._remote_eta
        return max(0.0, eta_s - (self.clock.now() - said_at))

    def server_unreachable(self, reason: str) -> None:
        """The provider's server refuses connections: shown on the provider,
        and no new task goes to it for a while."""
        if self._reachability is not None:
            self._reachability(reason)

    def server_reachable(self) -> None:
        if self._reachability is not None:
            self._reachability(None)

    async def set_remote_id(self, remote_id: str) -> None:
        """Persist the remote job id; returns only once it is durably stored."""
        self.beat()
        await self._record_remote_id(remote_id)


def _close(work: Awaitable[Any]) -> None:
    """Dispose of work a guard refused to start."""
    if inspect.iscoroutine(work):
        work.close()  # never started: close it so Python does not warn
    elif asyncio.isfuture(work):
        work.cancel()


class Runner(Protocol):
    """A kind of model (web or api) behind one small interface.

    The service calls every runner through this interface alone, never
    asking which kind it holds. A runner subclasses it explicitly, so mypy
    checks that it fits, and inherits the defaults below for what its kind
    has no use for.
    """

    # True when liveness must be proven by `ctx.beat()` (a frozen browser page
    # looks alive to asyncio); False when a live coroutine is proof enough.
    beats_required: bool
    # Hosts this runner may reach; a profile added by a reload must fit in it.
    allowlist: HostList

    async def start(self) -> None:
        """Acquire what lanes hold for their lifetime (locks, clients)."""

    async def run(self, task: Task, ctx: RunContext) -> RunResult:
        """Run one attempt; see the module docstring for what it may raise."""

    async def aclose(self) -> None:
        """Release everything `start` acquired; no process may be left behind."""

    def stats(self) -> RunnerStats:
        """Counters for the service's metrics."""

    # -- while running: a reload, an account added -----------------------------

    def add_owner(self, owner: str) -> None:
        """Serve `owner` (a web account, an API provider) from now on, as a
        reload or `accounts add` brings it; ConfigError, InputError or
        LockHeld when it cannot (a web account: its lock, its dir)."""
        return None  # a body, not just a docstring: a default, not abstract

    def apply_settings(self, settings: Settings) -> None:
        """A reload's live settings, from the next task on."""
        return None

    async def add_profiles(
        self, profiles: Mapping[str, Profile], concurrency: Mapping[str, int]
    ) -> None:
        """A reload's profiles: what serving them needs (an API client per new
        provider); their hosts are already on the allowlist."""
        return None

    def effective_concurrency(self, owner: str, quota: int) -> int:
        """The owner's lane concurrency now (an API provider's, after 429 storms)."""
        return quota

    def pool_size(self, owner: str) -> int | None:
        """The connection pool the owner's client was opened with, if it has one."""
        return None

    async def memory_view(self) -> MemoryView | None:
        """The runner's memory budget and its use now (the web runner's
        browsers), measured; None for a runner without one."""
        return None


class HostList(Protocol):
    """The outbound allowlist as the service sees it."""

    def allows(self, url: str) -> bool: ...


@dataclass(frozen=True)
class MemoryView:
    """A runner's memory budget and what holds it now (bytes, PSS)."""

    budget_bytes: int
    service_bytes: int  # the service's own processes (Python, drivers)
    browsers: dict[str, int]  # owner -> its open browser's process tree

    @property
    def total_bytes(self) -> int:
        return self.service_bytes + sum(self.browsers.values())


@dataclass(frozen=True)
class RunnerStats:
    """What a runner counts for the metrics: plain counters (summed over the
    runners) and requests by (provider, HTTP status)."""

    counters: dict[str, int] = field(default_factory=dict)
    remote_requests: dict[tuple[str, str], int] = field(default_factory=dict)
