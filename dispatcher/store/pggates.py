"""The providers' shared Retry-After gates, as the listener hears them (PostgreSQL).

A wait for a provider reads its shared gate (`Store.get_gate`, at most
every `apirunner.gate.SHARED_READ_S`): a round trip each, 0.35-0.95 a task
in benchmark 6 (issue 31). A gate written now also sends a notice on the
task channel (`GATE_SET`), and the listener each host keeps already
(`store.pglisten`) passes it here: `get_gate` answers from memory while the
listener is connected. Connected means: listening, then the gates read once
(so none written in between is missed); a lost connection puts the reads
back on the database until the listener is back and has read them again.
A notice lost without the connection dropping is caught up by the next
reconnect only: the listener's ping (5 s) bounds how long a dead connection
goes unnoticed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from dispatcher.store.pglisten import CHANNEL

# One statement: the gate moved later (never earlier), and the notice of it.
GATE_SET = f"""WITH g AS (
    INSERT INTO gates (provider, not_before) VALUES (%s, %s)
    ON CONFLICT (provider) DO UPDATE SET not_before = excluded.not_before
    WHERE excluded.not_before > gates.not_before
    RETURNING provider, not_before)
SELECT pg_notify('{CHANNEL}', json_build_object(
    'gate', provider, 'not_before', not_before,
    'host', coalesce(current_setting('dispatcher.host', true), ''))::text) FROM g"""
GATES = "SELECT provider, not_before FROM gates"


def parse_gate(payload: str) -> tuple[str, float] | None:
    """`(provider, not_before)` of a gate's notice; None for any other notice
    (a task's starts `{"host"` or with its id) or a malformed one."""
    if not payload.startswith('{"gate"'):
        return None
    try:
        body = json.loads(payload)
        return str(body["gate"]), float(body["not_before"])
    except (ValueError, KeyError, TypeError):
        return None


class GateMirror:
    """Each provider's gate (epoch seconds) while the listener is connected."""

    READ = GATES  # what the listener reads once listening

    def __init__(self) -> None:
        self._gates: dict[str, float] = {}
        self.live = False
        self.heard_count = 0  # gate notices taken in
        # The listener's connections so far: what was heard on an earlier
        # one may have missed notices since (`store.pgquota`).
        self.connections = 0

    def seed(self, gates: Iterable[tuple[str, float]]) -> None:
        """The gates as read after LISTEN began: from now on, every later one is heard."""
        for provider, not_before in gates:
            self._later(provider, float(not_before))
        self.connections += 1
        self.live = True

    def take(self, payload: str) -> bool:
        """Takes in a gate's notice; False for any other notice."""
        gate = parse_gate(payload)
        if gate is None:
            return False
        self.heard(*gate)
        return True

    def lost(self) -> None:
        self.live = False

    def heard(self, provider: str, not_before: float) -> None:
        self.heard_count += 1
        self._later(provider, not_before)

    def _later(self, provider: str, not_before: float) -> None:
        if not_before > self._gates.get(provider, 0.0):
            self._gates[provider] = not_before

    def get(self, provider: str) -> float | None:
        """The provider's gate (0.0: none), or None when it must be read."""
        return self._gates.get(provider, 0.0) if self.live else None
