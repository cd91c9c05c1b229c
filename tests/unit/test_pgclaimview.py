"""What a PostgreSQL host believes about claims without asking (`store.pgclaimview`)."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.models import Kind, State, Task
from dispatcher.store.pgclaimview import KEEP_S, ClaimView


@dataclass
class Listener:
    live: bool = True
    connections: int = 1


def _task(task_id: str, state: State, owner: str = "prov") -> Task:
    return Task(
        id=task_id,
        model="m",
        kind=Kind.API,
        queue="g",
        params={},
        fingerprint=task_id,
        created_at=0.0,
        state=state,
        owner=owner,
    )


def test_a_full_quota_holds_until_one_of_its_tasks_stops() -> None:
    view = ClaimView(Listener())
    view.quota_read("prov", 2, ["a", "b"], 10.0, view.sending())
    assert view.skip("prov", 2, 10.1)
    assert not view.skip("prov", 3, 10.1)  # a larger quota has room: asked
    view.quota_read("prov", 2, ["a", "b"], 10.0, view.sending())
    view.saw(_task("c", State.RUNNING, owner="other"))  # another provider's
    assert view.skip("prov", 2, 10.2)
    view.saw(_task("a", State.SUCCESS))
    assert not view.skip("prov", 2, 10.3)


def test_what_is_seen_while_a_claim_is_on_its_way_counts() -> None:
    view = ClaimView(Listener())
    sent = view.sending()
    view.saw(_task("a", State.SUCCESS))  # ended after the claim read it, maybe
    view.saw(_task("new", State.PENDING))  # inserted after the claim looked, maybe
    view.quota_read("prov", 2, ["a", "b"], 10.0, sent)
    view.claimed(False, 10.0, sent)
    assert not view.skip("prov", 2, 10.1)
    assert not view.skip(None, 0, 10.1)


def test_nothing_pending_holds_until_a_task_is_pending_or_a_second_passed() -> None:
    listener = Listener()
    view = ClaimView(listener)
    view.claimed(False, 10.0, view.sending())
    assert view.skip(None, 0, 10.5) and view.skip("prov", 5, 10.5)
    assert not view.skip(None, 0, 10.0 + KEEP_S)
    view.claimed(False, 20.0, view.sending())
    view.saw(_task("x", State.PENDING))
    assert not view.skip(None, 0, 20.1)
    # Not listening, or listening again since: nothing is believed.
    view.claimed(False, 30.0, view.sending())
    listener.connections += 1
    assert not view.skip(None, 0, 30.1)
    listener.live = False
    view.claimed(False, 40.0, view.sending())
    view.quota_read("prov", 1, ["a"], 40.0, view.sending())
    assert not view.skip("prov", 1, 40.1)
