"""The store's pool on a real PostgreSQL server: the connection used last goes out first."""

from __future__ import annotations

from dispatcher.store.pgpool import HotFirstPool
from tests.support.pgdb import migrated_database


async def _backend(pool: HotFirstPool) -> int:
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        assert row is not None
        return int(row[0])


async def test_the_connection_given_back_last_is_the_next_one_handed_out() -> None:
    with migrated_database() as url:
        pool = HotFirstPool(url, min_size=3, max_size=3, open=False)
        await pool.open(wait=True, timeout=10)
        try:
            first, second, third = [await pool.getconn() for _ in range(3)]
            pids = [conn.info.backend_pid for conn in (first, second, third)]
            for conn in (first, second, third):
                await pool.putconn(conn)
            # psycopg_pool's own order would hand out `first` (oldest first):
            # the same few backends stay hot under a light load.
            assert [await _backend(pool) for _ in range(4)] == [pids[2]] * 4
            # Under a load that needs two, the two used last.
            a, b = await pool.getconn(), await pool.getconn()
            assert {a.info.backend_pid, b.info.backend_pid} == {pids[2], pids[1]}
            await pool.putconn(a)
            await pool.putconn(b)
        finally:
            await pool.close()
