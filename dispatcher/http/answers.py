"""The answers of the local API, as pydantic models: their schemas are the
OpenAPI document's (`openapi.py`), and they mirror what `Api` returns.
Answers may gain fields; clients must ignore the ones they do not know."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dispatcher.http.limits import MAX_LIST
from dispatcher.models import JobState, Kind, Stage, State


class _Answer(BaseModel):
    # Answers may gain fields; clients must ignore the ones they do not know.
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Answer):
    kind: str = Field(description="not_found, invalid, conflict, unauthorized, forbidden, ...")
    message: str = Field(description="what is wrong, for a person")


class ErrorAnswer(_Answer):
    error: ErrorDetail


class TaskError(_Answer):
    kind: str
    message: str


class ArtifactInfo(_Answer):
    name: str
    kind: str = Field(description="screenshot, html, trace or answer")
    size: int


class AttemptAnswer(_Answer):
    attempt: int
    lane: str | None
    owner: str | None = Field(description="the web account or API provider whose lane ran it")
    outcome: State
    started_at: float | None
    ended_at: float | None
    error: TaskError | None
    stage_durations: dict[str, float]


class TaskAnswer(_Answer):
    id: str
    job_id: str | None
    model: str
    kind: Kind
    owner: str | None = Field(description="the web account or API provider whose lane ran it")
    params: dict[str, Any]
    fingerprint: str
    state: State
    stage: Stage | None
    attempt: int
    max_attempts: int
    cancel_requested: bool
    force: bool
    remote_id: str | None
    result: dict[str, Any] | None = Field(description='{"text": ...} and/or {"files": [...]}')
    error: TaskError | None
    from_cache: bool
    created_at: float
    started_at: float | None
    heartbeat_at: float | None
    finished_at: float | None
    stage_durations: dict[str, float]
    cost_estimate_usd: float | None = Field(
        default=None, description="dollars from the profile's [pricing]; null without prices"
    )
    cost_usd: float | None = Field(
        default=None,
        description="what it cost once finished: the vendor's reported usage, else the "
        "estimate; 0 from the cache",
    )
    priority: int = Field(default=0, description="higher runs first within its queue")
    deadline: float | None = Field(default=None, description="finish by then (epoch seconds)")
    deadline_action: str = Field(
        default="run", description='"run" it late, or "cancel" it when its turn comes too late'
    )
    late: bool = Field(
        default=False, description="past its deadline (finished after it, or not finished)"
    )
    fallbacks: list[str] = Field(
        default_factory=list,
        description="equivalent models it also waits for (`models`); once one of their "
        "lanes takes it, `model` is the one that runs it",
    )
    deduped: bool = Field(description="true when an identical recent task was returned")
    ahead: int = Field(
        description="pending tasks before this one in its lanes (on PostgreSQL, past 500 "
        "an estimate from the backlog's density)"
    )
    eta_s: float | None
    progress: float | None
    queue_position: float | None = Field(description="the vendor's queue position, if told")
    stage_detail: str | None = Field(
        default=None,
        description="what a running task's stage is doing now, in a few words: the node "
        "running (ComfyUI), 'queued on server, N ahead', 'waiting for the server ...'",
    )
    ref: str | None = Field(default=None, description="the task's name in its job")
    note: str | None = Field(
        default=None, description="why a pending task waits (its model is not loaded)"
    )
    waiting: str | None = Field(
        default=None,
        description="why a pending task cannot run (every lane serving it is disabled or "
        "needs attention); its eta_s is null then",
    )
    overdue_s: float | None = Field(
        default=None, description="how far a running task is past its estimate"
    )
    host: str | None = Field(
        default=None,
        description="the host that ran its current attempt (and holds its result files)",
    )
    result_on_host: str | None = Field(
        default=None,
        description="the host whose disk holds the result files, when this host cannot "
        "serve them (no shared results dir): ask that host; null when this one serves them",
    )
    artifacts: dict[str, list[ArtifactInfo]] = Field(
        default_factory=dict,
        description="per attempt: what a failed, stalled or canceled attempt left",
    )
    attempts: list[AttemptAnswer] | None = Field(
        default=None, description="the attempt history (GET /v1/tasks/{id} only)"
    )


class TaskPage(_Answer):
    items: list[TaskAnswer]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class JobSummary(_Answer):
    id: str
    name: str
    created_at: float
    state: JobState
    counts: dict[str, int]
    total: int
    from_cache: int = Field(default=0, description="tasks completed from the result cache")
    cost_usd: float = Field(default=0.0, description="what its finished tasks cost, in dollars")
    late: int = Field(
        default=0, description="its tasks past their deadline (finished after it, or not yet)"
    )
    finished_at: float | None = None
    elapsed_s: float | None = None


class JobAnswer(JobSummary):
    by_model: dict[str, dict[str, int]] = Field(
        description="the job's tasks per model and state (every state named)"
    )
    done: int = Field(description="tasks that ended: success, failed or canceled")
    eta_s: float | None = Field(
        description="seconds until the last of its waiting or running tasks should finish; "
        "null when unknown or while they cannot run"
    )
    waiting: str | None = Field(
        description="why its waiting tasks cannot run (every lane disabled or needing "
        "attention), instead of an ETA"
    )
    tasks_included: bool = Field(
        description=f"whether `tasks` is here: only for jobs of at most {MAX_LIST} tasks, "
        "and never with `?tasks=none`; page through a larger job with /v1/jobs/{id}/tasks"
    )
    tasks: list[TaskAnswer] | None = Field(
        default=None, description="every task of the job, in job order, when `tasks_included`"
    )


class JobPage(_Answer):
    items: list[JobSummary]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class Deliveries(_Answer):
    urls: list[str]
    queued: int = Field(description="events waiting to be written or sent (retries included)")
    delivering: int = Field(description="deliveries being posted now, on any host")
    failed: int = Field(description="deliveries given up, kept for `redeliver`")
    dropped: int = Field(description="deliveries this process gave up or could not keep")
    items: list[dict[str, Any]] = Field(description="recent delivery attempts, newest first")


class OutboxItem(_Answer):
    id: str = Field(description="the delivery (one event to one receiver)")
    event: str
    event_id: str = Field(description="the X-Dispatcher-Delivery header")
    url: str
    state: Literal["pending", "delivering", "failed"]
    attempts: int
    next_at: float
    host: str | None = Field(description="the host posting it now")
    last_status: int | None
    last_error: str | None
    created_at: float
    updated_at: float


class Outbox(_Answer):
    items: list[OutboxItem] = Field(description="newest first")


class Queue(_Answer):
    queue: str = Field(description="a queue: what its lanes take tasks from")
    waiting: int


class Live(_Answer):
    ok: bool


AccountStateName = Literal["ok", "cooldown", "needs_attention", "disabled", "unreachable"]


class LaneBudget(_Answer):
    daily_usd: float = Field(description="dollars the provider may spend per day (UTC)")
    spent_usd: float = Field(description="spent today: finished tasks' cost, running estimates")
    reached: bool = Field(description="true while waiting tasks do not fit what is left")
    until: float | None = Field(description="when it is whole again: 00:00 UTC (epoch s)")


class Lane(_Answer):
    name: str = Field(description='"web:<account>", "api:<provider>", or "invalid:<file>"')
    kind: Kind | None = Field(description="null for a profile file that is invalid")
    owner: str = Field(description="the web account or API provider this lane belongs to")
    models: list[str]
    concurrency: int
    effective_concurrency: int = Field(
        description="the quota, halved while 429s without Retry-After storm"
    )
    enabled: bool
    needs_attention: bool
    state: AccountStateName
    until: float | None
    since: float | None = Field(default=None, description="an unreachable provider's outage start")
    reason: str | None
    queued: int
    running: list[str]
    budget: LaneBudget | None = Field(
        default=None, description="the provider's daily budget, when it has one"
    )
    browser_memory_mb: float | None = Field(
        default=None,
        description="a web lane: its open browser's memory (PSS of its process tree, MB); "
        "null when none is open",
    )
    browser_memory_budget_mb: float | None = Field(
        default=None,
        description="a web lane: the memory the service and its browsers may hold on "
        "this host (`DISPATCHER_BROWSER_MEMORY_MB`)",
    )
    invalid: str | None = Field(
        default=None,
        description="an invalid profile file: every problem (file, key, why); "
        "its model refuses tasks until it is fixed and reloaded",
    )


class AddedAccount(_Answer):
    name: str
    models: list[str] = Field(description="the web models it serves (besides its profiles')")
    profiles: list[str] = Field(description="profile files that also list it")


class RemovedAccount(_Answer):
    name: str
    removed: bool = Field(description="gone now (false while it drains)")
    draining: bool = Field(description="takes no new task; goes when its running task ends")
    running: list[str]


class ReloadAnswer(_Answer):
    added: list[str]
    removed: list[str]
    changed: list[str]
    refused: dict[str, str] = Field(description="model -> why a restart is needed to apply it")
    invalid_profiles: list[dict[str, Any]] = Field(description="file, key, why, model")
    models: list[str] = Field(description="the models loaded after the reload")
    settings: dict[str, Any] = Field(description="live settings that changed: name -> value")
    settings_error: str | None = Field(description="why the settings were not applied")
    settings_sources: dict[str, list[dict[str, Any]]] = Field(
        default={},
        description="live setting -> where it is set (variable, source, value; secrets "
        "masked), the one used first: for each changed setting and each set in several places",
    )


class AccountAnswer(_Answer):
    name: str
    kind: Kind
    state: AccountStateName = Field(
        description="ok; cooldown (a usage cap, open again at `until`); needs_attention "
        "(`reason` says why); disabled (the operator's switch); unreachable (its server "
        "refuses connections since `since`; tried again from `until`; clears by itself)"
    )
    until: float | None = Field(
        description="epoch seconds a cooldown ends, or an unreachable provider is tried "
        "again; else null"
    )
    since: float | None = Field(
        default=None, description="epoch seconds an unreachable provider stopped answering"
    )
    enabled: bool
    reason: str | None
    needs_attention: bool
    updated_at: float


class HostAnswer(_Answer):
    host: str
    url: str | None = Field(description="where its local API answered when it started")
    this_host: bool
    state: Literal["alive", "silent", "dead"] = Field(
        description="silent: no beat within the stale bound; dead: declared dead or stopped"
    )
    alive: bool
    started_at: float
    heartbeat_at: float
    silent_s: float
    dead_at: float | None
    accounts: list[str] = Field(description="the web accounts it holds leases on")
    running: int = Field(description="tasks it runs now")


class LoginOpened(_Answer):
    account: str
    browser_pid: int | None
    path: str = Field(description="the dashboard page that shows the browser")


class LoginResult(_Answer):
    logged_in: bool
    account: Any = Field(description="the account (enabled) after a login, else its name")
    requeued: list[str] = Field(default=[], description="tasks back in the queue")
    cookies: int | None = Field(default=None, description="an import: cookies loaded")
    dropped: int | None = Field(
        default=None, description="an import: cookies for other sites, left out"
    )


class LoginClosed(_Answer):
    account: str
    closed: bool


class Ok(_Answer):
    ok: bool


class TextResult(_Answer):
    text: str | None


class Health(_Answer):
    ok: bool
    service: str
    pid: int
    lanes: int


class DashboardCode(_Answer):
    code: str = Field(description="one-time, valid for 2 minutes: /v1/session?code=...")


# -- operations ---------------------------------------------------------------------


class PlanAnswer(_Answer):
    models: list[dict[str, Any]] = Field(
        description="per model: tasks, duplicates, twins, cached, to_run, queued_ahead, "
        "cost_usd, unpriced, run_s, capacity, estimate_s, lower_bound_s, bound"
    )
    total: dict[str, Any] = Field(
        description="tasks, to_run, deduplicated, cached, cost_usd, unpriced, makespan_s, "
        "lower_bound_s and the bound that sets it"
    )
    stops: list[str] = Field(description="budgets that would stop the batch, and when")
    refusals: list[str] = Field(description="why the limits asked cannot be met")
    ok: bool = Field(description="true when no limit asked is unmet")
