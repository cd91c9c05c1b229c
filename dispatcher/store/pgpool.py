"""The store's connection pool: the connection used last is handed out first.

psycopg_pool hands out its idle connections oldest first, so a host with a
pool of ten cycles through ten server processes, each of them cold: its
caches (and the CPU's) hold another backend's data by its turn, and each
statement psycopg prepares is prepared on a connection only after five
plain runs there, per connection. Handed out newest first, the few
connections a host's load needs stay hot, and the ones a burst opened stay
idle at the back, where the pool's own shrinking closes the least recently
used. Measured (`python -m bench hosts`): the database's CPU per instant
task 1.10 -> 0.97 ms on one host, 1.63 -> 1.46 ms on three; ours 2.51 ->
2.38 ms.

What it changes is the order alone, through the pool's one method that
takes an idle connection (psycopg_pool 3.2 and later); a pool that no longer
calls it hands out oldest first again, which
`tests/integration/store/test_pgpool.py` tells.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

AnyConnection = psycopg.AsyncConnection[Any]


class HotFirstPool(AsyncConnectionPool[AnyConnection]):
    """`AsyncConnectionPool`, newest idle connection first (a stack, not a queue)."""

    async def _get_ready_connection(
        self,
        timeout: float | None,  # noqa: ASYNC109 (the overridden method's signature)
    ) -> AnyConnection | None:
        # The pool takes from the left and gives back to the right: the
        # newest, moved to the left, is the one taken. The others keep their
        # order, the least recently used at the left for the pool to close.
        if len(self._pool) > 1:
            self._pool.rotate(1)
        return await super()._get_ready_connection(timeout)
