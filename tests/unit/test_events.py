"""The SSE JSON of each event kind, pinned: the dashboard and outside SSE
clients read these shapes, so a change here is a change they see."""

from __future__ import annotations

from dispatcher.accounts.health import AccountState
from dispatcher.events import AccountChanged, EventBus, ProfilesReloaded, TaskChanged
from dispatcher.models import Kind, Stage, State, Task, TaskError


def test_task_changed_is_type_task_with_the_task_answer() -> None:
    task = Task(
        id="t1",
        model="demo-chat-api",
        kind=Kind.API,
        queue="api-model:demo-chat-api",
        params={"prompt": "hi"},
        fingerprint="fp",
        created_at=10.0,
        job_id="j1",
        ref="shot-1",
        owner="demo",
        state=State.PENDING,
        stage=Stage.DISPATCHED,
        attempt=2,
        max_attempts=3,
        error=TaskError(kind="transient", message="boom"),
        started_at=11.0,
        stage_durations={"dispatched": 0.5},
    )
    assert TaskChanged(task).to_json() == {
        "type": "task",
        "task": {
            "id": "t1",
            "job_id": "j1",
            "ref": "shot-1",
            "model": "demo-chat-api",
            "kind": "api",
            "owner": "demo",
            "params": {"prompt": "hi"},
            "fingerprint": "fp",
            "state": "pending",
            "stage": "dispatched",
            "attempt": 2,
            "max_attempts": 3,
            "cancel_requested": False,
            "force": False,
            "remote_id": None,
            "result": None,
            "error": {"kind": "transient", "message": "boom"},
            "from_cache": False,
            "created_at": 10.0,
            "started_at": 11.0,
            "heartbeat_at": None,
            "finished_at": None,
            "stage_durations": {"dispatched": 0.5},
            "cost_estimate_usd": None,
            "cost_usd": None,
            "priority": 0,
            "deadline": None,
            "deadline_action": "run",
            "fallbacks": [],
            "skipped": [],
            "late": False,
        },
    }


def test_account_changed_is_type_account_with_its_view_and_previous_state() -> None:
    view = {
        "name": "acct-1",
        "kind": "web",
        "enabled": True,
        "reason": "usage cap",
        "needs_attention": False,
        "updated_at": 5.0,
        "state": "cooldown",
        "until": 99.0,
    }
    event = AccountChanged(
        name="acct-1",
        kind=Kind.WEB,
        state=AccountState.COOLDOWN,
        previous=AccountState.OK,
        view=view,
    )
    assert event.to_json() == {"type": "account", "account": view, "previous": "ok"}
    first = AccountChanged("p", Kind.API, AccountState.OK, None, {"name": "p"})
    assert first.to_json() == {"type": "account", "account": {"name": "p"}, "previous": None}


def test_profiles_reloaded_is_type_reload_with_the_reload_answer_inline() -> None:
    answer = {"added": ["m"], "removed": [], "changed": [], "problems": [], "settings": {}}
    assert ProfilesReloaded(answer).to_json() == {"type": "reload", **answer}


async def test_subscribers_and_listeners_get_the_event_object_itself() -> None:
    bus = EventBus()
    heard: list[object] = []
    bus.listen(heard.append)
    event = ProfilesReloaded({})
    async with bus.subscribe() as queue:
        bus.publish(event)
        assert await queue.get() is event
    assert heard == [event] and bus.published == 1
