"""Which hosts are dead and what a claim proves across hosts: pure decisions."""

from __future__ import annotations

from dispatcher.hosts.watch import claim_guard, dead_hosts
from dispatcher.models import Kind
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.store.hosts import Fence, Host, Lease, Quota

WEB = LaneSpec("web:acct", Kind.WEB, "acct", ("web:chat",), ("chat",), 1)
API = LaneSpec("api:demo", Kind.API, "demo", ("video",), ("video",), 3)


def test_a_host_is_dead_once_silent_past_the_stale_bound_and_never_this_one() -> None:
    hosts = [
        Host("me", None, 0.0, heartbeat_at=0.0),
        Host("quiet", None, 0.0, heartbeat_at=10.0),
        Host("fresh", None, 0.0, heartbeat_at=95.0),
        Host("gone", None, 0.0, heartbeat_at=0.0, dead_at=50.0),
    ]
    found = dead_hosts(hosts, me="me", now=100.5, stale_after_s=90.0)
    assert [(d.host, d.silent_s) for d in found] == [("quiet", 90.5)]
    assert dead_hosts(hosts, me="me", now=100.0, stale_after_s=90.0) == []


def test_a_web_claim_proves_its_lease_and_an_api_claim_respects_the_global_quota() -> None:
    leases = {"acct": Lease("acct", "me", 7, 200.0)}
    assert claim_guard(WEB, 1, leases, shared=True) == (Fence("acct", 7), None)
    assert claim_guard(API, 2, leases, shared=True) == (None, Quota("demo", 2))
    # A lease lost: a token no lease has, so the claim takes nothing.
    assert claim_guard(WEB, 1, {}, shared=True) == (Fence("acct", 0), None)
    # One host (SQLite): the in-memory lane count is the whole truth.
    assert claim_guard(WEB, 1, leases, shared=False) == (None, None)
    assert claim_guard(API, 3, leases, shared=False) == (None, None)
