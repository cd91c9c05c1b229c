"""The narrow interface every store backend implements. No SQL outside `store/`.

Every task write is a compare-and-set: `update_task` applies its changes only
while the row still has the expected state (and attempt, when given) and
returns None when the row has moved on, so a late result can never overwrite
a newer decision.

Every member is a coroutine: on PostgreSQL each is a network round trip,
which must not block the event loop. The SQLite backend answers them inline
(see `store.sqlite`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from dispatcher.models import Account, Attempt, Job, JobState, JobSummary, State, Task
from dispatcher.pricing import AGING_STEP_S, Budget
from dispatcher.store.cacheindex import CacheIndex
from dispatcher.store.hosts import Fence, Host, Lease, LeaseRefused, Quota
from dispatcher.store.outbox import WebhookOutbox

if TYPE_CHECKING:
    # Only named in a signature: `store.beats` builds its SQL from `taskwrites`,
    # which imports this module.
    from dispatcher.store.beats import Heartbeat


@dataclass(frozen=True)
class TaskWrite:
    """One compare-and-set end or state write of a task: `update_task`'s
    arguments as one object, so that a write sent with a claim
    (`Store.finish_and_claim`) and one sent alone are the same write."""

    task_id: str
    # Keyword-only from here, as in `update_task`: `changes` has no default.
    _: KW_ONLY
    expect_state: State
    expect_attempt: int | None = None
    changes: Mapping[str, Any]
    unless_cancel_requested: bool = False
    ended: Attempt | None = None
    fence: Fence | None = None


@dataclass(frozen=True)
class NextClaim:
    """A lane's next claim, sent with the end write of the run that freed its
    slot (`Store.finish_and_claim`): `claim_next`'s arguments, the same claim."""

    queues: tuple[str, ...]
    now: float
    changes: Mapping[str, Any]
    fence: Fence | None = None
    quota: Quota | None = None
    budget: Budget | None = None
    aging_step_s: float = AGING_STEP_S
    prefer: tuple[str, ...] = field(default=())
    # What `claim_next` is told on a single host (SQLite): whether ranked
    # tasks or fallbacks wait (None: the statement looks itself).
    ranked: bool | None = None
    fallbacks: bool | None = None


class EndedAndClaimed(NamedTuple):
    """What `finish_and_claim` wrote: the task as ended (None: the write was
    refused, as `update_task`'s), and the task claimed (None: none)."""

    ended: Task | None
    claimed: Task | None


class InsertedAndClaimed(NamedTuple):
    """What `insert_and_claim` wrote: the task inserted or its twin (as
    `insert_unless_twin` answers them), and the task claimed (None: none)."""

    task: Task
    inserted: bool
    claimed: Task | None


class TaskWriter(Protocol):
    """`update_task`, spelled once for every backend: its keywords made one
    `TaskWrite`, which the backend writes (`write_task`). A backend subclasses
    this to inherit `update_task`; `Store` includes it."""

    async def update_task(
        self,
        task_id: str,
        *,
        expect_state: State,
        expect_attempt: int | None = None,
        changes: Mapping[str, Any],
        unless_cancel_requested: bool = False,
        ended: Attempt | None = None,
        fence: Fence | None = None,
    ) -> Task | None:
        """CAS: apply `changes` only if state (and attempt) still match, and, with
        `unless_cancel_requested`, only if nobody has asked to cancel the task.
        `ended` is written to the attempt history in the same transaction, only
        when the change applies. With `fence`, only while that account's lease
        still has that token (a write of an earlier holder is refused: None)."""
        return await self.write_task(
            TaskWrite(
                task_id,
                expect_state=expect_state,
                expect_attempt=expect_attempt,
                changes=changes,
                unless_cancel_requested=unless_cancel_requested,
                ended=ended,
                fence=fence,
            )
        )

    async def write_task(self, write: TaskWrite) -> Task | None:
        """`update_task` with its arguments as one object: the task as written,
        or None when it was refused (what each backend implements)."""


class Store(TaskWriter, Protocol):
    # Whether `insert_and_claim` can save a round trip (PostgreSQL): if not,
    # a submit does not look for a lane's claim to carry.
    claims_on_insert: bool

    async def migrate(self) -> None:
        """Apply the dialect's migrations not applied yet (see `store.migrations`)."""

    async def close(self) -> None: ...

    async def schema_version(self) -> int:
        """The last migration applied."""

    @property
    def cache_index(self) -> CacheIndex:
        """The result cache's index, on the same database (see `store.cacheindex`)."""

    @property
    def webhook_outbox(self) -> WebhookOutbox:
        """Webhook deliveries kept until delivered (see `store.outbox`)."""

    # -- tasks -----------------------------------------------------------
    async def insert_tasks(self, tasks: Sequence[Task], job: Job | None = None) -> list[Task]:
        """Insert tasks (and their job) atomically; returns them with `seq` set."""

    async def get_task(self, task_id: str) -> Task | None: ...

    async def get_tasks(self, task_ids: Sequence[str]) -> list[Task]:
        """The tasks of these ids that exist, oldest first (one read for many)."""

    async def finish_and_claim(self, write: TaskWrite, claim: NextClaim) -> EndedAndClaimed | None:
        """`write` (a run's end write, as `update_task` makes it), then
        `claim_next(claim)`, in one transaction (PostgreSQL: one pipeline, one
        round trip; SQLite: one commit); the claim runs whether or not the
        write applied, and sees it when it did. None: not done, nothing
        written (a claim known to find nothing): the caller makes the two
        calls itself (`write_task(write)`, then the claim)."""

    async def heartbeat_tasks(self, beats: Sequence[Heartbeat]) -> list[Task | None]:
        """The beats due at once (`store.beats`), each `update_task`'s
        compare-and-set of `heartbeat_at` and `stage` on a running attempt
        (fenced by its lease when it has one): the tasks as written, in the
        beats' order, None where a beat was refused. PostgreSQL: one
        statement for all."""

    async def task_attempts(self, task_id: str) -> list[Attempt]:
        """The task's ended attempts, oldest first."""

    async def list_tasks(
        self,
        *,
        states: Sequence[State] = (),
        model: str | None = None,
        job_id: str | None = None,
        text: str | None = None,
        before_seq: int | None = None,
        limit: int = 50,
        ref: str | None = None,
        after_seq: int | None = None,
        oldest_first: bool = False,
    ) -> list[Task]:
        """Newest first (oldest first with `oldest_first`); `text` is found in the
        params (the prompt) or the ref, `ref` in the ref only; `before_seq` pages
        on from a previous newest-first answer's last task, `after_seq` from an
        oldest-first one's."""

    async def ids_with_prefix(self, table: str, prefix: str, limit: int = 10) -> list[str]:
        """Ids of `tasks` or `jobs` starting with `prefix` (at most `limit`)."""

    async def claim_next(
        self,
        queues: Sequence[str],
        now: float,
        changes: Mapping[str, Any],
        *,
        fence: Fence | None = None,
        quota: Quota | None = None,
        budget: Budget | None = None,
        aging_step_s: float = AGING_STEP_S,
        prefer: Sequence[str] = (),
        ranked: bool | None = None,
        fallbacks: bool | None = None,
    ) -> Task | None:
        """First pending task of these queues whose `not_before` has passed, in
        queue order (`pricing.order_key`: priority aged by `aging_step_s`, then
        deadline, then FIFO), moved to running with `changes` in the same atomic
        step (row-locked on PostgreSQL: hosts claiming at once never take the
        same task). With `fence`, only while that lease holds; with `quota`,
        only while fewer than `quota.limit` tasks bound to `quota.owner` run
        on all hosts together; with `budget`, only a task whose estimated cost
        keeps the provider's spend since `budget.since` within its limit.
        A fallback task (waiting here as a later choice) is left to the lanes
        of `prefer` queues when it names one of them earlier
        (`scheduling.fallbacks`). `ranked` / `fallbacks`: what the caller knows
        (`ranked_waiting`, `fallbacks_waiting`); None: asked here."""

    async def tasks_in_state(
        self, state: State, limit: int | None = None, *, host: str | None = None
    ) -> list[Task]:
        """Oldest first; with `host`, only the tasks that host ran."""

    async def stale_running(self, heartbeat_before: float) -> list[Task]:
        """Running tasks whose last heartbeat (or start) is older than the bound."""

    async def count_ahead(self, queue: str, seq: int) -> int:
        """Pending tasks of the queue inserted before `seq`."""

    async def running_owners(self, queue: str) -> int:
        """Lane owners (accounts, providers) running a task of the queue now, on
        any host: the capacity serving a queue that other hosts share."""

    async def queue_place(self, queue: str, seq: int, *, owners: bool) -> tuple[int, int]:
        """`count_ahead` and, with `owners`, `running_owners` (else 0), read
        together: one round trip on PostgreSQL for a pending task's answer."""

    async def queued_counts(self) -> dict[str, int]:
        """Pending tasks per queue."""

    async def state_counts(self) -> dict[tuple[str, str], int]:
        """Tasks per (model, state), for metrics."""

    async def recent_durations(self, model: str, limit: int = 20) -> list[float]:
        """Run times (started to finished) of the model's latest successes."""

    async def find_by_fingerprint(self, fingerprint: str, created_since: float) -> Task | None:
        """Newest task with this fingerprint created since then, not failed or canceled."""

    async def insert_unless_twin(self, task: Task, created_since: float) -> tuple[Task, bool]:
        """Insert the task unless `find_by_fingerprint` finds a twin, atomically
        (across hosts too): (the stored task, True) or (its twin, False)."""

    async def insert_and_claim(
        self, task: Task, created_since: float, claim: NextClaim
    ) -> InsertedAndClaimed | None:
        """`insert_unless_twin`, then `claim_next(claim)` (which sees the new
        task), in one transaction: on PostgreSQL one pipeline, one round trip
        (the submit of a task a lane can start now). None: not done, nothing
        written (SQLite, where a statement is no round trip; a quota known
        full): the caller inserts alone."""

    # -- jobs --------------------------------------------------------------
    async def get_job(self, job_id: str) -> Job | None: ...

    async def job_tasks(self, job_id: str) -> list[Task]: ...

    async def job_counts(self, job_id: str) -> dict[State, int]: ...

    async def job_model_counts(self, job_id: str) -> dict[tuple[str, State], int]:
        """The job's tasks per (model, state): one grouped read, not the tasks."""

    async def list_jobs(
        self,
        *,
        states: Sequence[JobState] = (),
        text: str | None = None,
        before_seq: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Newest first; `text` is found in the name; paged like `list_tasks`."""

    async def job_summaries(
        self, job_ids: Sequence[str], now: float | None = None
    ) -> dict[str, JobSummary]:
        """Counts per state, cache answers, the last finish, the cost and the late
        tasks (finished after their deadline; with `now`, also unfinished past it)
        for each job."""

    async def tell_job_finish(self, job_id: str, last_finished_at: float) -> bool:
        """True for exactly one caller (of all hosts) per finish of the job,
        named by its latest task `finished_at`: `job.finished` is told once."""

    async def tell_budget_reached(self, provider: str, until: float, now: float) -> bool:
        """True for exactly one caller (of all hosts) per provider and day (named
        by `until`, 00:00 UTC after it): `budget.reached` is told once."""

    # -- cost (issue 30) ------------------------------------------------------------
    async def spent_since(self, provider: str, since: float) -> float:
        """Dollars the provider's tasks started since then cost (finished) or
        reserve (running, their estimate): what its daily budget counts."""

    async def ranked_waiting(self, queues: Sequence[str]) -> bool:
        """Whether a pending task of the queues has a priority or a deadline."""

    async def fallbacks_waiting(self) -> bool:
        """Whether any pending task waits with fallback queues (`alt_queues`)."""

    async def generations_since(self, owner: str, since: float) -> int:
        """Attempts the lane owner started since then, the running one included,
        except those put back without being charged: a web account's allowance."""

    async def cheapest_ready(self, queues: Sequence[str], now: float) -> float | None:
        """The smallest estimated cost of the groups' ready pending tasks; None: none ready."""

    async def cost_by_provider(self) -> dict[str, float]:
        """Dollars finished tasks cost, per provider (lane owner), for /metrics."""

    # -- accounts (web accounts and API providers) ---------------------------
    async def get_accounts(self) -> dict[str, Account]: ...

    async def upsert_account(self, account: Account) -> None: ...

    async def delete_account(self, name: str) -> None: ...

    # -- web accounts added at run time ----------------------------------------
    async def get_web_accounts(self) -> dict[str, tuple[str, ...]]:
        """Account name -> the models it serves, for accounts added at run time."""

    async def put_web_account(self, name: str, models: Sequence[str], added_at: float) -> None: ...

    async def delete_web_account(self, name: str) -> None: ...

    # -- several hosts on one database -----------------------------------------
    async def register_host(self, host: str, now: float, url: str | None = None) -> None:
        """This host is alive (again): heartbeat now, no longer dead."""

    async def host_heartbeat(self, host: str, now: float) -> bool:
        """False once another host has declared this one dead: re-register and
        reconcile, its running tasks have been recovered elsewhere."""

    async def list_hosts(self) -> list[Host]: ...

    async def stale_hosts(self, heartbeat_before: float) -> list[Host]:
        """Hosts not declared dead whose last heartbeat is older than the bound."""

    async def publish_models(self, host: str, cards: Mapping[str, str]) -> None:
        """The models this host runs now (model -> its card, JSON text), replacing
        what it published before."""

    async def served_models(self) -> list[tuple[str, str, str]]:
        """(host, model, card) for every model a host not declared dead runs."""

    async def mark_host_dead(self, host: str, heartbeat_before: float, now: float) -> bool:
        """Declare a stale host dead; True for the one caller that did (CAS)."""

    async def acquire_lease(
        self, account: str, host: str, now: float, ttl_s: float
    ) -> Lease | LeaseRefused:
        """Bind the account to this host with a new token, unless another live
        host holds an unexpired lease on it (then who)."""

    async def renew_lease(self, lease: Lease, now: float, ttl_s: float) -> Lease | None:
        """Extend a lease still held with its token; None once it was lost."""

    async def release_lease(self, lease: Lease) -> bool: ...

    async def list_leases(self) -> list[Lease]:
        """Leases held now (released ones are not listed)."""

    async def set_gate(self, provider: str, not_before: float) -> None:
        """No host sends to the provider before then (a later gate never moves back)."""

    async def get_gate(self, provider: str) -> float:
        """The provider's gate: epoch seconds, 0 when it never had one."""
