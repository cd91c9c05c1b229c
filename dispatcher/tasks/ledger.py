"""The one place that changes tasks: checks the guard, writes CAS, tells the world.

It is also the one place where what runners report (errors, results, remote
ids: a vendor's or a page's words) is made safe before anything is stored or
sent: secrets masked, text made storable on every store; see `redaction`.

Every state change goes through here: it is checked by `states`, applied by
the store as a compare-and-set, logged as one line with the lane prefix, and
published on the event bus. A write against a row that has moved on is
rejected by the store, logged, and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher.clock import Clock
from dispatcher.errors import InputError, RunError, StateConflict, StoreError
from dispatcher.events import EventBus, TaskChanged
from dispatcher.logs import scrub
from dispatcher.models import (
    JSON,
    Attempt,
    Job,
    Skipped,
    Stage,
    State,
    Task,
    TaskError,
    new_id,
)
from dispatcher.pricing import finished_cost_usd
from dispatcher.profiles import Profile
from dispatcher.scheduling.decisions import Reclaim
from dispatcher.scheduling.withend import ClaimWithEnd
from dispatcher.store import Store
from dispatcher.store.base import TaskWrite
from dispatcher.store.beats import Heartbeat
from dispatcher.store.hosts import Fence
from dispatcher.strictjson import storable_text
from dispatcher.tasks import states
from dispatcher.tasks.claims import TaskClaims
from dispatcher.tasks.fingerprint import (
    LocalFiles,
)
from dispatcher.tasks.intake import Intake, ResultStore
from dispatcher.tasks.lines import lane_prefix, log_fields, log_rejected, log_transition
from dispatcher.tasks.redaction import redacted
from dispatcher.tasks.resultpaths import real_result, stored_result
from dispatcher.tasks.spec import TaskSpec
from dispatcher.tasks.submitclaim import InsertClaims, insert_claiming
from dispatcher.tasks.waitflags import WaitFlags

log = logging.getLogger("dispatcher.tasks")

MAX_JOB_TASKS = 10_000


@dataclass(frozen=True)
class Submitted:
    task: Task
    deduped: bool = False


class Ledger(TaskClaims):
    """Changes tasks (submit, claim, the ends of an attempt, cancel, retry); its
    reads come from `TaskReads`, its claims from `TaskClaims`."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        profiles: Mapping[str, Profile],
        events: EventBus,
        *,
        retry_delay_s: float,
        cache: ResultStore | None = None,
        results_dir: Path | None = None,
        reference_files: LocalFiles | None = None,
        host: str | None = None,
        shared: bool = False,
    ) -> None:
        self.store = store
        self.host = host  # recorded on every task this host claims
        # Several hosts on one database: this host reclaims only its own stale
        # tasks; a silent host's are recovered as a whole (`HostWatch`).
        self.shared = shared
        self.clock = clock
        self.events = events
        self.retry_delay_s = retry_delay_s
        self.intake = Intake(
            store,
            clock,
            profiles,
            cache=cache,
            results_dir=results_dir,
            reference_files=reference_files,
            host=host,
        )
        # Whether a claim must look for fallbacks or sort its queues.
        self.flags = WaitFlags(shared=shared)
        # The scheduler, when it runs: a submit's insert may carry a claim.
        self.insert_claims: InsertClaims | None = None
        self.dedup_hits = 0
        self.retries = 0
        self.stale_reclaims = 0

    @property
    def cache_hits(self) -> int:
        return self.intake.cache_hits

    @property
    def invalid_models(self) -> dict[str, str]:
        """Models whose profile is broken (or not applied live): why, for a clear refusal."""
        return self.intake.invalid_models

    @invalid_models.setter
    def invalid_models(self, why: dict[str, str]) -> None:
        self.intake.invalid_models = why

    # -- creating ------------------------------------------------------------
    def _deduped(self, task: Task, existing: Task) -> Submitted:
        self.dedup_hits += 1
        log.info(
            "%s task %s deduped onto %s",
            lane_prefix(existing),
            task.id,
            existing.id,
            extra=log_fields(existing, task_id=task.id),
        )
        return Submitted(existing, deduped=True)

    async def submit(self, spec: TaskSpec) -> Submitted:
        """Store a task, or answer with its twin, or complete it from the cache.

        Image hashing and cache file copies run in worker threads (a plain
        cache miss does not need one). The twin
        check that counts is the store's, atomic with the insert (across
        hosts too): two identical submits racing through the threads, or on
        two hosts, still make one task. The early look skips the cache work
        for a twin.
        """
        await self.intake.learn([spec])
        (images,) = await self.intake.image_hashes([spec], in_job=False)
        task = self.intake.new_task(spec, None, images)
        since = self.intake.twin_window_start(task)
        cached: JSON | None = None
        # A plain miss (nearly every new task) has no cache work to skip:
        # no early look then (a read), the insert's own check is enough.
        if since is not None and self.intake.may_answer(task):
            existing = await self.intake.twin(task)
            if existing is not None:
                return self._deduped(task, existing)
            cached = await self.intake.cache_lookup(task)
        task = self.intake.completed(task, cached)
        if since is None:
            (stored,) = await self.store.insert_tasks([task])
            self._announce(stored, None)
            return Submitted(stored)
        if self.insert_claims is not None and self.store.claims_on_insert:
            # A lane with a free slot claims with the insert (`submitclaim`).
            # Shielded: a task claimed must reach its start (a cancel after
            # the commit would leave it running without a runner, 90 s).
            stored, inserted = await asyncio.shield(
                insert_claiming(
                    self.store, self.insert_claims, task, since, self._next_claim, self._announce
                )
            )
        else:
            stored, inserted = await self.store.insert_unless_twin(task, since)
            if inserted:
                self._announce(stored, None)
        if not inserted:
            if cached is not None and self.intake.results_dir is not None:
                folder = self.intake.results_dir / task.id
                await asyncio.to_thread(shutil.rmtree, folder, True)
            return self._deduped(task, stored)
        return Submitted(stored)

    async def create_job(self, name: str, specs: Sequence[TaskSpec]) -> tuple[Job, list[Task]]:
        if not specs:
            raise InputError("a job needs at least one task")
        if len(specs) > MAX_JOB_TASKS:
            raise InputError(f"a job takes at most {MAX_JOB_TASKS} tasks")
        job = Job(id=new_id(), name=name, created_at=self.clock.now())
        # Validate everything before writing anything: a bad line rejects the whole
        # job rather than leaving half of it queued.
        await self.intake.learn(specs)
        hashes = await self.intake.image_hashes(specs, in_job=True)
        tasks = []
        refs: dict[str, int] = {}
        for index, (spec, images) in enumerate(zip(specs, hashes, strict=True)):
            if spec.ref is not None:
                if spec.ref in refs:
                    raise InputError(
                        f"tasks[{index}]: ref {spec.ref!r} is already used by "
                        f"tasks[{refs[spec.ref]}]; refs are unique within a job"
                    )
                refs[spec.ref] = index
            try:
                tasks.append(self.intake.new_task(spec, job.id, images))
            except InputError as exc:
                raise InputError(f"tasks[{index}]: {exc}") from exc
        if self.intake.cache is not None:
            found = await asyncio.to_thread(self.intake.cache_lookups, tasks)
            tasks = [self.intake.completed(t, c) for t, c in zip(tasks, found, strict=True)]
        stored = await self.store.insert_tasks(tasks, job)
        for task in stored:
            self._announce(task, None)
        return job, stored

    # -- writing -------------------------------------------------------------
    async def _write(
        self,
        task: Task,
        new_state: State,
        changes: Mapping[str, Any],
        *,
        why: str = "",
        unless_cancel_requested: bool = False,
        fenced: bool = True,
        with_end: ClaimWithEnd | None = None,
    ) -> Task | None:
        states.check_transition(task.state, new_state)
        changes = redacted(changes)
        why = storable_text(scrub(why))
        write = TaskWrite(
            task.id,
            expect_state=task.state,
            expect_attempt=task.attempt,
            changes={**changes, "state": new_state},
            unless_cancel_requested=unless_cancel_requested,
            ended=self._ended(task, new_state, changes, why),
            fence=_fence(task) if fenced else None,
        )
        both = None
        if with_end is not None and not with_end.sent:
            # The lane's next claim in the same round trip (`scheduling.withend`).
            try:
                both = await self.store.finish_and_claim(write, await self._next_claim(with_end))
            except StoreError as exc:
                # Neither was written (one transaction): the end alone, as
                # ever, so that a failing claim never costs the run's outcome.
                log.warning(
                    "%s task %s: end and next claim failed (%s)",
                    lane_prefix(task),
                    task.id,
                    exc,
                    extra=log_fields(task, attempt=task.attempt),
                )
        if both is None:
            updated = await self.store.write_task(write)
        else:
            updated = both.ended
            assert with_end is not None
            with_end.sent, with_end.claimed = True, both.claimed
        if updated is None:
            if not unless_cancel_requested:
                current = await self.store.get_task(task.id)
                log_rejected(task, new_state, current, why, fenced=_fence(task) is not None)
        elif new_state is not task.state:
            self._announce(updated, task.state, why)
        if both is not None and both.claimed is not None:
            self._announce(both.claimed, State.PENDING)
        return updated

    def _ended(
        self, task: Task, new_state: State, changes: Mapping[str, Any], why: str
    ) -> Attempt | None:
        """The history row of a running attempt this write ends, if it ends one."""
        if task.state is not State.RUNNING or new_state is State.RUNNING:
            return None
        error = changes.get("error", task.error) if new_state is not State.SUCCESS else None
        if error is None and new_state is State.PENDING and why:
            error = TaskError(kind="requeued", message=why)
        return Attempt(
            task_id=task.id,
            attempt=task.attempt,
            queue=task.queue,
            owner=task.owner,
            outcome=new_state,
            started_at=task.started_at,
            ended_at=self.clock.now(),
            error=error,
            stage_durations=dict(changes.get("stage_durations", task.stage_durations)),
        )

    def _announce(self, task: Task, old: State | None, why: str = "") -> None:
        self.flags.seen(task)
        log_transition(task, old, why)
        self.events.publish(TaskChanged(task))

    async def take_as(
        self, task: Task, profile: Profile, fingerprint: str, skipped: Sequence[Skipped] = ()
    ) -> Task | None:
        """A fallback taken by a lane of one of its equivalent models: it is now
        that model's task (its cache entry follows the model that runs it);
        `skipped` says why the models it listed first were passed over."""
        changes: dict[str, Any] = {"model": profile.name, "kind": profile.kind}
        changes |= {"queue": profile.queue, "fingerprint": fingerprint, "skipped": tuple(skipped)}
        return await self._write(task, State.RUNNING, changes, why="fallback")

    async def record_remote_id(self, task: Task, remote_id: str) -> Task:
        updated = await self._write(task, State.RUNNING, {"remote_id": remote_id})
        if updated is None:
            raise StateConflict(f"task {task.id} moved on before its remote id was stored")
        return updated

    async def adopt(self, task: Task) -> Task | None:
        """This host takes over a running task (its own from a previous run, or
        a dead host's): a fresh heartbeat, and the task is this host's now."""
        return await self._write(
            task,
            State.RUNNING,
            {"heartbeat_at": self.clock.now(), "stage": task.stage, "host": self.host},
            fenced=False,
        )

    async def heartbeat(self, task: Task, stage: Stage | None) -> Task | None:
        (seen,) = await self.heartbeats([(task, stage)])
        return seen

    async def heartbeats(self, beats: Sequence[tuple[Task, Stage | None]]) -> list[Task | None]:
        """Running tasks' signs of life, written together (`store.beats`):
        each as it is now, None where its attempt or its lease moved on."""
        now = self.clock.now()
        written = await self.store.heartbeat_tasks(
            [Heartbeat(task.id, task.attempt, now, stage, _fence(task)) for task, stage in beats]
        )
        refused = [task for (task, _), seen in zip(beats, written, strict=True) if seen is None]
        if refused:
            # What the rows hold now, for the lines: one read for all of them.
            now_held = {t.id: t for t in await self.store.get_tasks([t.id for t in refused])}
            for task in refused:
                log_rejected(
                    task, State.RUNNING, now_held.get(task.id), "", fenced=_fence(task) is not None
                )
        return written

    async def succeed(
        self,
        task: Task,
        result: JSON,
        stage_durations: Mapping[str, float],
        *,
        with_end: ClaimWithEnd | None = None,
    ) -> Task | None:
        """Write the result. Keeping it in the cache for identical tasks is
        `keep_in_cache`'s, which the scheduler calls once the run's slot is
        given back. `with_end`: the lane's next claim, sent with this write
        (`scheduling.withend`).
        """
        return await self._end_attempt(
            task,
            State.SUCCESS,
            {
                # Relative to the results dir: a restore elsewhere still finds the files.
                "result": stored_result(result, self.intake.results_dir),
                # Persisting ends with this very write: a finished task has no stage.
                "stage": None,
                "finished_at": self.clock.now(),
                "stage_durations": dict(stage_durations),
                "cost": finished_cost_usd(task.cost_estimate, result),
            },
            what="result",
            with_end=with_end,
        )

    async def keep_in_cache(self, done: Task) -> None:
        """Keep a succeeded task's result in the cache for identical tasks.

        The cache keeps what the task stored (secrets already masked).
        Linking or copying its files is file work: a thread does it while
        the loop serves every other lane. A result without files is one
        upsert of a local index (SQLite) or a put kept in memory for the
        index's writer thread (PostgreSQL), made on the loop's thread when
        nothing else needs doing (`ResultCache.store_text_here`).
        """
        cache = self.intake.cache
        if cache is None or done.state is not State.SUCCESS:
            return
        kept = done.result
        if kept is not None and self.intake.results_dir is not None:
            kept = real_result(kept, self.intake.results_dir, done.id)
        if (
            not done.from_cache
            and kept is not None
            and not cache.store_text_here(done.fingerprint, done.model, kept)
        ):
            await asyncio.to_thread(cache.store_result, done.fingerprint, done.model, kept)

    async def _end_attempt(
        self,
        task: Task,
        new_state: State,
        changes: Mapping[str, Any],
        *,
        what: str,
        why: str = "",
        with_end: ClaimWithEnd | None = None,
    ) -> Task | None:
        """Write how a running attempt ended, unless a cancel was asked for meanwhile.

        The cancel check rides on the CAS itself (one statement in the common
        case); only a refused write reads the row to find out why. A cancel
        wins over the attempt's outcome: the task ends canceled.
        """
        done = await self._write(
            task, new_state, changes, why=why, unless_cancel_requested=True, with_end=with_end
        )
        if done is not None:
            return done
        current = await self.store.get_task(task.id)
        if (
            current is not None
            and current.cancel_requested
            and current.state is State.RUNNING
            and current.attempt == task.attempt
        ):
            log.info(
                "%s task %s: %s arrived after cancel; dropped",
                lane_prefix(task),
                task.id,
                what,
                extra=log_fields(task, attempt=task.attempt),
            )
            return await self.mark_canceled(current, changes.get("stage_durations"))
        log_rejected(task, new_state, current, why, fenced=_fence(task) is not None)
        return None

    async def fail(
        self,
        task: Task,
        error: RunError,
        stage_durations: Mapping[str, float] | None = None,
        *,
        keep_remote_id: bool = False,
    ) -> Task | None:
        """End the attempt as failed: retried (a fresh submit) or finished.

        `keep_remote_id`: the remote job is sound and only our side failed;
        a retry resumes it instead of submitting (and paying) again.
        """
        fate = states.after_failure(
            attempt=task.attempt,
            max_attempts=task.max_attempts,
            retryable=error.retryable,
            now=self.clock.now(),
            retry_delay_s=self.clock.scaled(self.retry_delay_s),
        )
        changes: dict[str, Any] = {
            "error": TaskError(kind=error.kind, message=error.message),
            "stage_durations": dict(stage_durations or {}),
        }
        changes.update(self._after_attempt(fate.state, fate.attempt, fate.not_before))
        if keep_remote_id:
            changes.pop("remote_id", None)
        return await self._end_attempt(
            task, fate.state, changes, what="error", why=f"{error.kind}: {error.message}"
        )

    def _after_attempt(self, next_state: State, attempt: int, not_before: float) -> dict[str, Any]:
        """Changes for an attempt that ended badly: re-queued fresh, or finished."""
        if next_state is State.PENDING:
            self.retries += 1
            return {
                "attempt": attempt,
                "not_before": not_before,
                "stage": None,
                "remote_id": None,
                "heartbeat_at": None,
            }
        return {"finished_at": self.clock.now(), "stage": None}

    async def mark_canceled(
        self,
        task: Task,
        stage_durations: Mapping[str, float] | None = None,
        error: TaskError | None = None,  # why, when nobody asked (a missed deadline)
        *,
        with_end: ClaimWithEnd | None = None,
    ) -> Task | None:
        changes: dict[str, Any] = {"finished_at": self.clock.now()}
        if error is not None:
            changes["error"] = error
        if stage_durations is not None:
            changes["stage_durations"] = dict(stage_durations)
        return await self._write(task, State.CANCELED, changes, with_end=with_end)

    async def requeue(
        self, task: Task, why: str, *, forget_remote: bool = False, fenced: bool = True
    ) -> Task | None:
        """Back to pending on the same attempt: it never got far enough to count.

        `forget_remote`: its remote job lives on a provider that no longer
        serves it; a remote id is only ever resumed where it was accepted,
        so the next lane submits afresh.
        """
        changes: dict[str, Any] = {"stage": None, "heartbeat_at": None, "owner": None}
        if forget_remote:
            changes["remote_id"] = None
        return await self._write(task, State.PENDING, changes, why=why, fenced=fenced)

    async def hold_unloaded(self, task: Task, delay_s: float) -> Task | None:
        """Back to pending, same attempt, for a while: its model is not loaded now."""
        return await self._write(
            task,
            State.PENDING,
            {
                "stage": None,
                "heartbeat_at": None,
                "owner": None,
                "not_before": self.clock.now() + delay_s,
            },
            why=f"model {task.model!r} is not loaded",
        )

    async def expire(self, task: Task, *, fenced: bool = True) -> Task | None:
        return await self._write(
            task,
            State.FAILED,
            {
                "error": TaskError(
                    kind="expired", message="running for over 2 h; failed as expired"
                ),
                "finished_at": self.clock.now(),
            },
            why="expired",
            fenced=fenced,
        )

    async def reclaim(self, task: Task, plan: Reclaim, *, fenced: bool = True) -> Task | None:
        self.stale_reclaims += 1
        changes: dict[str, Any] = {"error": TaskError(kind="stale", message=plan.reason)}
        changes.update(self._after_attempt(plan.next_state, plan.next_attempt, plan.not_before))
        return await self._write(
            task, plan.next_state, changes, why=f"stale: {plan.reason}", fenced=fenced
        )


def _fence(task: Task) -> Fence | None:
    """A running attempt claimed under an account lease writes only while that
    lease is still the one it ran under (see `Store.update_task`)."""
    if task.state is not State.RUNNING or task.lease_token is None or task.owner is None:
        return None
    return Fence(task.owner, task.lease_token)
