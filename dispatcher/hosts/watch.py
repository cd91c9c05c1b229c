"""This host among the hosts sharing one PostgreSQL database.

At start the host registers itself and binds its web accounts with leases
(`Store.acquire_lease`); a heartbeat loop then keeps the host alive in the
registry, renews the leases and declares dead any host silent past the stale
bound, whose running tasks this host then recovers (`Service._take_over`).

What to do is decided by pure functions (`dead_hosts`, `claim_guard`); this
class only carries the answers to the store. On SQLite one host owns the
file: the host registers, and nothing else here runs (no leases, no quota in
the claim, no dead hosts), so a single host pays nothing for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from dispatcher.background import stop_background
from dispatcher.clock import Clock
from dispatcher.errors import StoreError
from dispatcher.models import JSON, Kind, State
from dispatcher.scheduling.decisions import HEARTBEAT_INTERVAL_S, STALE_AFTER_S
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.store import Store
from dispatcher.store.hosts import Fence, Host, Lease, LeaseRefused, Quota

log = logging.getLogger("dispatcher.hosts")


@dataclass(frozen=True)
class DeadHost:
    host: str
    silent_s: float


def dead_hosts(
    hosts: Sequence[Host], *, me: str, now: float, stale_after_s: float
) -> list[DeadHost]:
    """Live hosts other than this one silent for longer than the stale bound."""
    return [
        DeadHost(h.id, now - h.heartbeat_at)
        for h in hosts
        if h.alive and h.id != me and now - h.heartbeat_at > stale_after_s
    ]


def claim_guard(
    lane: LaneSpec, limit: int, leases: Mapping[str, Lease], *, shared: bool
) -> tuple[Fence | None, Quota | None]:
    """What a claim of this lane must prove in the store: the web account's
    lease (its fencing token), or the provider's quota over all hosts."""
    if not shared:
        return None, None
    if lane.kind is Kind.WEB:
        lease = leases.get(lane.owner)
        # No lease (lost): a token no lease has, so the claim takes nothing.
        return Fence(lane.owner, lease.token if lease is not None else 0), None
    return None, Quota(lane.owner, limit)


class HostWatch:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        host: str,
        *,
        shared: bool,
        on_dead: Callable[[str], Awaitable[None]],
        on_lost: Callable[[str], Awaitable[None]],
    ) -> None:
        self.store = store
        self.clock = clock
        self.host = host
        self.shared = shared
        self._on_dead = on_dead
        self._on_lost = on_lost
        self.leases: dict[str, Lease] = {}
        self.refused: dict[str, LeaseRefused] = {}
        self._loop: asyncio.Task[None] | None = None
        # The local API's address, once it serves: kept for a re-register.
        self.url: str | None = None
        # Set once the scheduler runs: a dead host's tasks need it to resume.
        self.take_over_dead = False
        self.beats = 0

    @property
    def heartbeat_s(self) -> float:
        return self.clock.scaled(HEARTBEAT_INTERVAL_S)

    @property
    def stale_s(self) -> float:
        return self.clock.scaled(STALE_AFTER_S)

    async def register(self, url: str | None = None) -> None:
        if url is not None:
            self.url = url
        await self.store.register_host(self.host, self.clock.now(), self.url)

    # -- web accounts ------------------------------------------------------------
    async def bind(self, accounts: Iterable[str]) -> None:
        """Take a lease on each account not bound yet; a refusal is logged and kept."""
        if not self.shared:
            return
        for account in sorted(set(accounts) - set(self.leases)):
            got = await self.store.acquire_lease(account, self.host, self.clock.now(), self.stale_s)
            if isinstance(got, LeaseRefused):
                if account not in self.refused:
                    log.error("%s; its lane is not opened on host %r", got.message, self.host)
                self.refused[account] = got
            else:
                if self.refused.pop(account, None) is not None:
                    log.info("web account %r is now served by host %r", account, self.host)
                self.leases[account] = got

    async def held_elsewhere(self, account: str) -> LeaseRefused | None:
        """Who serves the account when another live host holds its lease (the
        same rule as `acquire_lease`, read only: nothing is bound)."""
        if not self.shared:
            return None
        now = self.clock.now()
        dead = {h.id for h in await self.store.list_hosts() if not h.alive}
        for lease in await self.store.list_leases():
            if (
                lease.account == account
                and lease.host != self.host
                and lease.expires_at > now
                and lease.host not in dead
            ):
                return LeaseRefused(account, lease.host, lease.expires_at)
        return None

    async def release(self, account: str) -> None:
        """Give up an account this host no longer serves: another host may bind it now."""
        lease = self.leases.pop(account, None)
        self.refused.pop(account, None)
        if lease is not None:
            await self.store.release_lease(lease)
            log.info("web account %r released by host %r", account, self.host)

    def bound(self, lanes: Mapping[str, LaneSpec]) -> dict[str, LaneSpec]:
        """The lanes this host may open: not those of a web account it was refused."""
        return {
            name: lane
            for name, lane in lanes.items()
            if not (lane.kind is Kind.WEB and lane.owner in self.refused)
        }

    def refused_lanes(self) -> list[JSON]:
        """A lane per web account another host holds, for the lanes list."""
        return [
            {
                "name": f"web:{account}",
                "kind": Kind.WEB.value,
                "owner": account,
                "models": [],
                "concurrency": 0,
                "enabled": False,
                "needs_attention": False,
                "reason": refusal.message,
                "invalid": refusal.message,
                "refused": refusal.holder,
                "queued": 0,
                "running": [],
            }
            for account, refusal in sorted(self.refused.items())
        ]

    def guard(self, lane: LaneSpec, limit: int) -> tuple[Fence | None, Quota | None]:
        return claim_guard(lane, limit, self.leases, shared=self.shared)

    # -- the heartbeat -------------------------------------------------------------
    def start(self) -> None:
        if self.shared:
            self._loop = asyncio.create_task(self._run(), name="host-heartbeat")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.beat()
            except StoreError as exc:
                # The database is away: our leases lapse after the stale bound
                # unless a later beat renews them in time.
                log.error("host heartbeat failed: %s", exc)
            except Exception:
                # A bug in one beat must not end them all: with no beat, this
                # host's leases lapse and another host takes its accounts
                # while its tasks still run here.
                log.exception("host heartbeat failed unexpectedly; the next beat tries again")

    async def beat(self) -> None:
        """One heartbeat: alive, leases renewed, dead hosts found and recovered."""
        now = self.clock.now()
        self.beats += 1
        if not await self.store.host_heartbeat(self.host, now):
            log.warning(
                "host %r was declared dead by another host (silent past %.1f s); "
                "its running tasks were recovered there; registering again",
                self.host,
                self.stale_s,
            )
            await self.register()
        for account, lease in list(self.leases.items()):
            renewed = await self.store.renew_lease(lease, now, self.stale_s)
            if self.leases.get(account) is not lease:
                # Released (account removed) or bound anew while the renewal
                # was in flight: that change wins, nothing was lost.
                continue
            if renewed is not None:
                self.leases[account] = renewed
                continue
            del self.leases[account]
            owner = next((x for x in await self.store.list_leases() if x.account == account), None)
            who = owner.host if owner is not None else "nobody"
            self.refused[account] = LeaseRefused(account, who, owner.expires_at if owner else 0.0)
            log.error(
                "web account %r: lease token %d lost (now held by %s); its lane is closed "
                "here and its running task's writes are dropped",
                account,
                lease.token,
                who,
            )
            await self._on_lost(account)
        if not self.take_over_dead:
            return
        hosts = await self.store.list_hosts()
        for dead in dead_hosts(hosts, me=self.host, now=now, stale_after_s=self.stale_s):
            if await self.store.mark_host_dead(dead.host, now - self.stale_s, now):
                log.warning(
                    "host %r is silent for %.1f s (dead, or stopped with tasks running); "
                    "recovering its running tasks",
                    dead.host,
                    dead.silent_s,
                )
                await self._on_dead(dead.host)

    async def aclose(self) -> None:
        if self._loop is not None:
            await stop_background(self._loop)
            self._loop = None
        for lease in list(self.leases.values()):
            # Released at a clean stop: the account may move at once.
            with contextlib.suppress(StoreError):
                await self.store.release_lease(lease)
        self.leases.clear()
        if self.shared:
            with contextlib.suppress(StoreError):
                await self._sign_off()

    async def _sign_off(self) -> None:
        """A clean stop that leaves nothing running leaves the registry too, so
        the other hosts do not report it dead 90 s later. One that leaves API
        jobs running stays registered: if it is not back within the stale
        bound, a live host resumes them (they are not stranded until a
        restart that may never come)."""
        if await self.store.tasks_in_state(State.RUNNING, host=self.host):
            log.info(
                "host %r stops with tasks still running: it resumes them at its next start, "
                "or another host does if it is not back within %.0f s",
                self.host,
                self.stale_s,
            )
            return
        await self.store.mark_host_dead(self.host, math.inf, self.clock.now())
