"""The records the dispatcher keeps: tasks, jobs, accounts, cache entries.

Plain dataclasses; the store turns them into rows and back. Timestamps are
wall-clock epoch seconds from the service clock.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

JSON = dict[str, Any]


class State(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    CANCELED = "canceled"


TERMINAL_STATES = frozenset({State.SUCCESS, State.FAILED, State.CANCELED})


class Stage(StrEnum):
    DISPATCHED = "dispatched"
    UPLOADING = "uploading"  # reference images on their way to the vendor
    QUEUED = "queued"  # accepted by the vendor, waiting in its own queue
    GENERATING = "generating"
    DOWNLOADING = "downloading"
    PERSISTING = "persisting"


class Kind(StrEnum):
    WEB = "web"
    API = "api"


DEFAULT_MAX_ATTEMPTS = 3  # first run + 2 retries


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class TaskError:
    kind: str
    message: str

    def to_json(self) -> JSON:
        return {"kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class Skipped:
    """A model a fallback task named before the one that ran it, passed over:
    its lanes were out of budget, out of allowance, needed attention, were
    unreachable or busy (`reason` says which, lane by lane)."""

    model: str
    reason: str

    def to_json(self) -> JSON:
        return {"model": self.model, "reason": self.reason}


@dataclass
class Task:
    """One generation for one model; one row in the results table."""

    id: str
    model: str
    kind: Kind
    # What it waits in, which lanes may take it: "api-model:<model>" or
    # "web:<model>" (not a lane).
    queue: str
    params: JSON
    fingerprint: str
    created_at: float
    job_id: str | None = None
    ref: str | None = None  # the client's own name for it, unique within its job
    # The web account or API provider whose lane ran it (the last one).
    owner: str | None = None
    state: State = State.PENDING
    stage: Stage | None = None
    attempt: int = 1
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    cancel_requested: bool = False
    force: bool = False
    remote_id: str | None = None
    result: JSON | None = None
    error: TaskError | None = None
    from_cache: bool = False
    started_at: float | None = None
    heartbeat_at: float | None = None
    finished_at: float | None = None
    not_before: float = 0.0  # a retry waits until then
    stage_started_at: float | None = None
    stage_durations: dict[str, float] = field(default_factory=dict)
    seq: int = 0  # insertion order, assigned by the store; FIFO key
    # The host that ran its current attempt and the account lease token it ran
    # under (see `Store.acquire_lease`); None on a task no host has claimed.
    host: str | None = None
    lease_token: int | None = None
    # Issue 30: dollars from the price table at intake (what a budget
    # reserves while it runs) and what it cost once finished; its place in
    # the queue (higher priority first, then the earliest deadline).
    cost_estimate: float | None = None
    cost: float | None = None
    priority: int = 0
    deadline: float | None = None
    deadline_action: str = "run"  # "cancel": canceled when its turn comes too late
    # Fallbacks: the queues of the equivalent models it also waits in; the
    # lane that takes it first makes it its model's task.
    alt_queues: tuple[str, ...] = ()
    # The models a fallback passed over before the one that took it, and why.
    skipped: tuple[Skipped, ...] = ()

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def replace(self, **changes: Any) -> Task:
        """`dataclasses.replace` without its trip through `__init__` (it reads
        and passes all 36 fields, several times a task): a shallow copy with
        the changes, unknown names refused as `replace` refuses them."""
        unknown = changes.keys() - _TASK_FIELDS
        if unknown:
            raise TypeError(f"Task has no field(s) {sorted(unknown)}")
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def to_json(self) -> JSON:
        return {
            "id": self.id,
            "job_id": self.job_id,
            "ref": self.ref,
            "model": self.model,
            "kind": self.kind.value,
            "owner": self.owner,
            "params": self.params,
            "fingerprint": self.fingerprint,
            "state": self.state.value,
            "stage": self.stage.value if self.stage else None,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "cancel_requested": self.cancel_requested,
            "force": self.force,
            "remote_id": self.remote_id,
            "result": self.result,
            "error": self.error.to_json() if self.error else None,
            "from_cache": self.from_cache,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "heartbeat_at": self.heartbeat_at,
            "finished_at": self.finished_at,
            "stage_durations": self.stage_durations,
            "cost_estimate_usd": self.cost_estimate,
            "cost_usd": self.cost,
            "priority": self.priority,
            "deadline": self.deadline,
            "deadline_action": self.deadline_action,
            "fallbacks": [queue.split(":", 1)[1] for queue in self.alt_queues],
            "skipped": [skip.to_json() for skip in self.skipped],
            # Unfinished tasks past their deadline are flagged where the clock
            # is known (`late_at`, the task's live info).
            "late": self.late_at(self.finished_at) if self.finished_at is not None else False,
        }

    def late_at(self, now: float) -> bool:
        """Past its deadline at `now` (its finish, once finished); never when it has none."""
        if self.deadline is None or self.state in (State.FAILED, State.CANCELED):
            return False
        end = self.finished_at if self.finished_at is not None else now
        return end > self.deadline


_TASK_FIELDS = frozenset(f.name for f in dataclasses.fields(Task))


@dataclass
class Attempt:
    """How one attempt of a task ended: a row of the task's history.

    `outcome` is the state the task went to when the attempt ended
    (`pending` when it was re-queued for another attempt or recovered).
    """

    task_id: str
    attempt: int
    queue: str
    outcome: State
    ended_at: float
    owner: str | None = None
    started_at: float | None = None
    error: TaskError | None = None
    stage_durations: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {
            "attempt": self.attempt,
            # An API attempt ran on its provider's lane; a web one names
            # the model's queue (its account, the owner, is beside it).
            "lane": f"api:{self.owner}"
            if self.owner and self.queue.startswith("api")
            else self.queue,
            "owner": self.owner,
            "outcome": self.outcome.value,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "error": self.error.to_json() if self.error else None,
            "stage_durations": self.stage_durations,
        }


@dataclass
class Job:
    id: str
    name: str
    created_at: float
    seq: int = 0  # insertion order, assigned by the store; the listing cursor


@dataclass
class JobSummary:
    """A job's numbers without its tasks: what a listing shows per job."""

    counts: dict[State, int]
    from_cache: int = 0  # tasks answered from the result cache
    last_finished_at: float | None = None
    cost_usd: float = 0.0  # what its finished tasks cost (issue 30)
    late: int = 0  # tasks past their deadline


class JobState(StrEnum):
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    CANCELED = "canceled"
    PARTIAL = "partial"


@dataclass
class Account:
    """A web account or an API provider: the operator's on/off switch for a lane."""

    name: str
    kind: Kind
    enabled: bool = True
    reason: str | None = None
    needs_attention: bool = False
    updated_at: float = 0.0
    cooldown_until: float | None = None  # epoch seconds: a usage cap lifts then

    def to_json(self) -> JSON:
        return {
            "name": self.name,
            "kind": self.kind.value,
            "enabled": self.enabled,
            "reason": self.reason,
            "needs_attention": self.needs_attention,
            "updated_at": self.updated_at,
        }


@dataclass
class CacheEntry:
    fingerprint: str
    model: str
    result: JSON  # the task result, file paths pointing into the cache dir
    size_bytes: int
    created_at: float
    last_used_at: float
