"""The one small interface every runner implements, and what it is handed.

A runner turns one claimed task into a `RunResult` or raises:
`TaskCanceled` when it noticed a cancel at a checkpoint, a `RunError`
(transient or permanent) when the attempt failed. It never writes task state
itself: the scheduler owns every state write; the runner reports through its
`RunContext` (liveness, stage, the remote id).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dispatcher.clock import Clock
from dispatcher.errors import TaskCanceled
from dispatcher.models import JSON, Stage, Task
from dispatcher.profiles import Profile


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


class RunContext:
    """What a runner may see and do while it runs one attempt of one task."""

    def __init__(
        self,
        *,
        task: Task,
        profile: Profile,
        lane: str,
        account: str,
        clock: Clock,
        result_dir: Path,
        log: logging.LoggerAdapter[Any],
        report_stage: StageReporter,
        record_remote_id: RemoteIdRecorder,
        history_s: tuple[float, ...] = (),
    ) -> None:
        self.task = task
        # Nominal run times of recent jobs of the same model and shape
        # (`dispatcher.history`): where an async job's poll expects its end.
        self.history_s = history_s
        self.profile = profile
        self.lane = lane
        self.account = account
        self.clock = clock
        self.result_dir = result_dir
        self.log = log
        self.cancel_event = asyncio.Event()
        self.last_beat_monotonic = clock.monotonic()
        # Set by the scheduler before it interrupts the run: "reclaimed" (stale).
        self.interrupted: str | None = None
        self._report_stage = report_stage
        self._record_remote_id = record_remote_id

    @property
    def canceled(self) -> bool:
        return self.cancel_event.is_set()

    def check_canceled(self) -> None:
        """A checkpoint: raise TaskCanceled once an operator has asked to cancel."""
        if self.cancel_event.is_set():
            raise TaskCanceled(f"task {self.task.id} canceled")

    def beat(self) -> None:
        """Say "still alive"; the scheduler persists a heartbeat at most every 15 s."""
        self.last_beat_monotonic = self.clock.monotonic()

    async def set_stage(
        self,
        stage: Stage,
        progress: float | None = None,
        queue_position: int | None = None,
    ) -> None:
        self.beat()
        await self._report_stage(stage, progress, queue_position)

    async def set_remote_id(self, remote_id: str) -> None:
        """Persist the remote job id; returns only once it is durably stored."""
        self.beat()
        await self._record_remote_id(remote_id)


class Runner(Protocol):
    """A kind of model (web or api) behind one small interface."""

    # True when liveness must be proven by `ctx.beat()` (a frozen browser page
    # looks alive to asyncio); False when a live coroutine is proof enough.
    beats_required: bool

    async def start(self) -> None:
        """Acquire what lanes hold for their lifetime (locks, clients)."""

    async def run(self, task: Task, ctx: RunContext) -> RunResult:
        """Run one attempt; see the module docstring for what it may raise."""

    async def aclose(self) -> None:
        """Release everything `start` acquired; no process may be left behind."""
