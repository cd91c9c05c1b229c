"""One API model served by two providers (two demo API processes): a batch
spreads over both within each one's quota, a disabled provider's share goes
to the other, a restart resumes a job on the provider that accepted it, and
a task queued by a version without per-model queues still runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from demo.api_provider import start_demo_api
from demo.comfyui import start_demo_comfy
from dispatcher.models import Kind, State, Task
from dispatcher.store.migrations import latest_version
from dispatcher.store.rows import task_to_row
from dispatcher.store.sqlite import SqliteStore
from tests.support.harness import Harness, running_service
from tests.support.helpers import REPO

QUOTA = 2  # each demo provider's own quota, and our concurrency for it


def _write_profile(tmp_path: Path, url_a: str, url_b: str) -> None:
    """demo-video, served by providers "vid-a" and "vid-b" (each its own server)."""
    text = (REPO / "profiles" / "demo-video.toml").read_text(encoding="utf-8")
    text = text.replace('name = "demo-video"', 'name = "multi-video"')
    text = text.replace('provider = "demo"', 'providers = ["vid-a", "vid-b"]')
    text = text.replace("${DEMO_API_URL}", url_a)
    text += f'\n[api.providers.vid-b]\nbase_url = "{url_b}"\n'
    target = tmp_path / "profiles"
    target.mkdir(exist_ok=True)
    (target / "multi-video.toml").write_text(text, encoding="utf-8")


@asynccontextmanager
async def _two_providers(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    a = await start_demo_api(time_scale=0.02, quota=QUOTA)
    b = await start_demo_api(time_scale=0.02, quota=QUOTA)
    try:
        _write_profile(tmp_path, a.url, b.url)
        yield a.url, b.url
    finally:
        await a.stop()
        await b.stop()


def _service(tmp_path: Path, state: Path | None = None) -> Any:
    return running_service(
        tmp_path,
        profiles=(),
        state_dir=state,
        concurrency={"vid-a": QUOTA, "vid-b": QUOTA},
    )


async def _stats(h: Harness, url: str) -> dict[str, Any]:
    return await h.demo_stats(url)


async def test_a_batch_spreads_over_both_providers_within_each_quota(tmp_path: Path) -> None:
    async with _two_providers(tmp_path) as (url_a, url_b), _service(tmp_path) as h:
        lanes = {lane["name"]: lane for lane in (await h.http.get("/v1/lanes")).json()}
        for name in ("api:vid-a", "api:vid-b"):
            assert lanes[name]["models"] == ["multi-video"]
            assert lanes[name]["owner"] == name.removeprefix("api:")
            assert "account" not in lanes[name]  # the old name went in 0.2
            assert lanes[name]["concurrency"] == QUOTA
        shots = [
            {"model": "multi-video", "params": {"prompt": f"shot {i}", "gen_s": 5}}
            for i in range(10)
        ]
        job = await h.job("spread", shots)
        done = await h.wait_job(job["id"])
        assert done["counts"]["success"] == 10
        by_provider = {t["owner"] for t in done["tasks"]}
        assert by_provider == {"vid-a", "vid-b"}
        a, b = await _stats(h, url_a), await _stats(h, url_b)
        assert a["jobs_created"] + b["jobs_created"] == 10
        assert a["jobs_created"] == sum(t["owner"] == "vid-a" for t in done["tasks"])
        assert 1 <= a["max_concurrent"] <= QUOTA and 1 <= b["max_concurrent"] <= QUOTA


async def test_a_disabled_providers_share_goes_to_the_other(tmp_path: Path) -> None:
    async with _two_providers(tmp_path) as (url_a, url_b), _service(tmp_path) as h:
        response = await h.http.post("/v1/accounts/vid-a/disable", json={"reason": "quota"})
        assert response.status_code == 200, response.text
        shots = [
            {"model": "multi-video", "params": {"prompt": f"s{i}", "gen_s": 5}} for i in range(5)
        ]
        job = await h.job("one side", shots)
        done = await h.wait_job(job["id"])
        assert done["counts"]["success"] == 5
        assert {t["owner"] for t in done["tasks"]} == {"vid-b"}
        assert (await _stats(h, url_a))["requests"] == 0
        assert (await _stats(h, url_b))["max_concurrent"] <= QUOTA


async def test_a_restart_resumes_the_job_on_the_provider_that_accepted_it(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    async with _two_providers(tmp_path) as (url_a, url_b):
        async with _service(tmp_path, state) as h:
            await h.http.post("/v1/accounts/vid-a/disable", json={"reason": "only b for now"})
            task = await h.submit("multi-video", "outlives the dispatcher", gen_s=150)
            running = await h.wait_task(task["id"], {"running"})
            for _ in range(500):
                running = await h.task(task["id"])
                if running["remote_id"]:
                    break
                await asyncio.sleep(0.02)
            assert running["owner"] == "vid-b" and running["remote_id"]
            # Both lanes are open again: only the remote id's binding decides.
            await h.http.post("/v1/accounts/vid-a/enable")
            await h.http.post("/v1/accounts/vid-b/disable", json={"reason": "now a only"})
        async with _service(tmp_path, state) as h:
            done = await h.wait_task(task["id"])
            assert done["state"] == "success" and done["attempt"] == 1
            assert done["owner"] == "vid-b" and done["remote_id"] == running["remote_id"]
            a, b = await _stats(h, url_a), await _stats(h, url_b)
            assert a["requests"] == 0  # never asked about a job it does not hold
            assert b["jobs_created"] == 1  # resumed, not submitted again


async def test_a_task_queued_per_provider_by_an_earlier_version_still_runs(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    store = SqliteStore(state / "dispatcher.db")
    await store.migrate()
    # The database as version 3 left it: API tasks queued as "api:<provider>".
    store._db.execute("DELETE FROM schema_version WHERE version >= 4")
    # Later migrations are replayed too: undo them.
    store._db.execute("DROP TABLE web_accounts")  # 5
    store._db.execute("ALTER TABLE accounts DROP COLUMN cooldown_until")  # 6
    for table in ("hosts", "leases", "gates"):  # 7
        store._db.execute(f"DROP TABLE {table}")
    store._db.execute("ALTER TABLE tasks DROP COLUMN host")
    store._db.execute("ALTER TABLE tasks DROP COLUMN lease_token")
    store._db.execute("ALTER TABLE jobs DROP COLUMN finish_told_at")  # 8
    store._db.execute("DROP TABLE webhook_outbox")  # 9
    store._db.execute("DROP TABLE budget_told")  # 12
    store._db.execute("DROP INDEX attempts_owner")  # 13
    store._db.execute("ALTER TABLE tasks DROP COLUMN skipped")
    store._db.execute("DROP INDEX tasks_spend")  # 11
    store._db.execute("DROP INDEX tasks_ranked")
    store._db.execute("DROP INDEX tasks_fallback")
    columns = ("cost_estimate", "cost", "priority", "deadline_action", "deadline", "alt_queues")
    for column in columns:
        store._db.execute(f"ALTER TABLE tasks DROP COLUMN {column}")
    for table in ("tasks", "attempts"):  # 10
        store._db.execute(f"ALTER TABLE {table} RENAME COLUMN queue TO lane_group")
        store._db.execute(f"ALTER TABLE {table} RENAME COLUMN owner TO account")
    store._db.execute("DROP TABLE cache_entries")
    store._db.execute(
        "CREATE TABLE cache_entries (fingerprint TEXT PRIMARY KEY, model TEXT NOT NULL, "
        "result TEXT NOT NULL, size_bytes INTEGER NOT NULL, created_at REAL NOT NULL, "
        "last_used_at REAL NOT NULL)"
    )
    legacy = Task(
        id="legacy0001",
        model="multi-video",
        kind=Kind.API,
        queue="api:vid-a",
        params={"prompt": "queued before the upgrade", "gen_s": 1},
        fingerprint="legacy-fp",
        created_at=1.0,
    )
    later = (
        "host",
        "lease_token",
        "cost_estimate",
        "cost",
        "priority",
        "deadline_action",
        "skipped",
    )
    old_names = {"queue": "lane_group", "owner": "account"}
    row = {
        old_names.get(k, k): v
        for k, v in task_to_row(legacy).items()
        if k not in (*later, *columns)
    }
    store._db.execute(
        f"INSERT INTO tasks ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
        tuple(row.values()),
    )
    await store.close()
    async with _two_providers(tmp_path), _service(tmp_path, state) as h:
        done = await h.wait_task("legacy0001")
        assert done["state"] == "success" and done["owner"] in {"vid-a", "vid-b"}
        assert await h.service.store.schema_version() == latest_version("sqlite")


async def test_shots_of_a_comfyui_model_on_two_servers_render_on_both(tmp_path: Path) -> None:
    a = await start_demo_comfy(time_scale=0.02)
    b = await start_demo_comfy(time_scale=0.02)
    try:
        text = (REPO / "profiles" / "demo-comfy.toml").read_text(encoding="utf-8")
        text = text.replace('name = "demo-comfy"', 'name = "two-gpus"')
        text = text.replace('provider = "demo-comfy"', 'providers = ["gpu-a", "gpu-b"]')
        text = text.replace("${DEMO_COMFY_URL}", a.url)
        text += f'\n[api.providers.gpu-b]\nbase_url = "{b.url}"\n'
        (tmp_path / "profiles").mkdir()
        (tmp_path / "profiles" / "two-gpus.toml").write_text(text, encoding="utf-8")
        # Two servers and the service share one event loop on a busy CI: at
        # the default 0.02 a task is stale after 1.8 s without a heartbeat,
        # and a 2.4 s stall of the machine once reclaimed both shots running.
        async with running_service(tmp_path, profiles=("demo-comfy",), time_scale=0.05) as h:
            lanes = {lane["name"]: lane for lane in (await h.http.get("/v1/lanes")).json()}
            assert lanes["api:gpu-a"]["concurrency"] == lanes["api:gpu-b"]["concurrency"] == 1
            shots = [
                {"model": "two-gpus", "params": {"prompt": f"shot {i}", "steps": 40}}
                for i in range(6)
            ]
            done = await h.wait_job((await h.job("story", shots))["id"])
            assert done["counts"]["success"] == 6
            stats = [await h.demo_stats(server.url) for server in (a, b)]
            # Each server rendered exactly the shots recorded as run there, one at a time.
            assert [len(s["prompts"]) for s in stats] == [
                sum(t["owner"] == name for t in done["tasks"]) for name in ("gpu-a", "gpu-b")
            ]
            assert all(s["prompts"] and s["max_running"] == 1 for s in stats)
    finally:
        await a.stop()
        await b.stop()


async def test_a_job_left_on_a_provider_no_longer_listed_is_submitted_afresh_elsewhere(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    store = SqliteStore(state / "dispatcher.db")
    await store.migrate()
    now = time.time()
    orphan = Task(
        id="orphan0001",
        model="multi-video",
        kind=Kind.API,
        queue="api-model:multi-video",
        params={"prompt": "its provider was taken out", "gen_s": 1},
        fingerprint="orphan-fp",
        created_at=now - 10,
        state=State.RUNNING,
        started_at=now - 10,
        heartbeat_at=now - 5,
        owner="vid-gone",
        remote_id="video_on_gone",
    )
    await store.insert_tasks([orphan])
    await store.close()
    async with _two_providers(tmp_path) as (url_a, url_b), _service(tmp_path, state) as h:
        done = await h.wait_task("orphan0001")
        assert done["state"] == "success" and done["owner"] in {"vid-a", "vid-b"}
        assert done["remote_id"] != "video_on_gone" and done["attempt"] == 1
        stats = [await _stats(h, url) for url in (url_a, url_b)]
        # Submitted once, on one provider; nobody was asked about the foreign id.
        assert sum(s["jobs_created"] for s in stats) == 1
