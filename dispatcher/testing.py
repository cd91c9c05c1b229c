"""Parts for testing code that drives runners, without a browser or a vendor.

`FakeRunner` is a `Runner` (mypy checks it against the protocol, as it does
the real two): each run waits, through `RunContext.guard` as a real runner
waits, until the test releases it, so a test says exactly when each run
ends. `run_context` makes the `RunContext` a scheduler would hand a runner,
with a `Reports` that keeps what the run reported.

    runner = FakeRunner()
    scheduler = Scheduler(..., runners={Kind.API: runner}, ...)
    await scheduler.round()
    assert runner.started == ["p0"]      # the prompts, in the order they ran
    runner.finish("p0")                  # its run returns RunResult(text="answer to p0")
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatcher.clock import Clock, SystemClock
from dispatcher.models import Stage, Task
from dispatcher.profiles import Profile
from dispatcher.scheduling.protocol import HostList, RunContext, Runner, RunnerStats, RunResult


class EveryHost:
    """An allowlist that allows every host (nothing goes out of a fake)."""

    def allows(self, url: str) -> bool:
        return True


class FakeRunner(Runner):
    """Records what runs, in order; each run waits for its release (or a cancel)."""

    def __init__(self, *, beats_required: bool = False, allowlist: HostList | None = None) -> None:
        self.beats_required = beats_required
        self.allowlist = allowlist or EveryHost()
        self.started: list[str] = []  # each run's prompt, as it starts
        self.release: dict[str, asyncio.Event] = {}  # set one to let that run return
        self.running = False  # between start and aclose

    async def start(self) -> None:
        self.running = True

    async def aclose(self) -> None:
        self.running = False

    def stats(self) -> RunnerStats:
        return RunnerStats(counters={"fake_runs": len(self.started)})

    def finish(self, prompt: str) -> None:
        """Let the run of `prompt` return its answer (now, or as soon as it starts)."""
        self.release.setdefault(prompt, asyncio.Event()).set()

    async def run(self, task: Task, ctx: RunContext) -> RunResult:
        prompt = str(task.params["prompt"])
        self.started.append(prompt)
        gate = self.release.setdefault(prompt, asyncio.Event())
        await ctx.guard(gate.wait())  # TaskCanceled on a cancel
        return RunResult(text=f"answer to {prompt}")


@dataclass
class Reports:
    """What one run reported through its context: stages and remote ids, in order."""

    stages: list[tuple[Stage, float | None, int | None]] = field(default_factory=list)
    remote_ids: list[str] = field(default_factory=list)

    async def stage(self, stage: Stage, progress: float | None, queue_position: int | None) -> None:
        self.stages.append((stage, progress, queue_position))

    async def remote_id(self, remote_id: str) -> None:
        self.remote_ids.append(remote_id)


def run_context(
    task: Task,
    profile: Profile,
    *,
    owner: str,
    result_dir: Path,
    clock: Clock | None = None,
    reports: Reports | None = None,
    log: logging.LoggerAdapter[Any] | None = None,
) -> RunContext:
    """The context a scheduler hands a runner for one attempt of `task` in
    the lane of `owner` (a web account, an API provider)."""
    reports = reports or Reports()
    lane = f"{profile.kind.value}:{owner}"
    return RunContext(
        task=task,
        profile=profile,
        lane=lane,
        owner=owner,
        clock=clock or SystemClock(),
        result_dir=result_dir,
        log=log or logging.LoggerAdapter(logging.getLogger("dispatcher.testing"), {"lane": lane}),
        report_stage=reports.stage,
        record_remote_id=reports.remote_id,
    )
