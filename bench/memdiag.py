"""Where memory goes between drains: a diagnostic, not one of the benchmarks.

    flock /tmp/bench.lock .venv/bin/python -m bench.memdiag CYCLES TASKS [FRAMES]

Benchmark 4's cycle (switch the provider off, submit TASKS pending tasks,
switch it on, drain), CYCLES times, against `bench.service_child` with
`BENCH_MEMDIAG` set: after each drain the child counts its live objects by
type and, when FRAMES > 0, keeps a tracemalloc snapshot (FRAMES deep). It
prints RSS after each drain, the types whose counts grew, and the allocation
sites that grew between consecutive drains and from the second drain to the
last. tracemalloc slows the service down by about half, so use fewer tasks
per cycle than the benchmark does; a per-task leak shows all the same.
"""

from __future__ import annotations

import asyncio
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.common import ServiceProc, Vendor, call, fresh_dir, profiles_dir, service_env
from bench.memory import MODEL, PROVIDER, QUOTA, _drain, _settle, _submit


def _type_growth(before: dict[str, int], after: dict[str, int], top: int = 12) -> str:
    grown = sorted(
        ((after.get(k, 0) - before.get(k, 0), k) for k in set(before) | set(after)),
        reverse=True,
    )
    return ", ".join(f"{name} {delta:+d}" for delta, name in grown[:top] if delta)


def _site_growth(before: str, after: str, top: int = 12) -> None:
    old = tracemalloc.Snapshot.load(before)
    new = tracemalloc.Snapshot.load(after)
    for stat in new.compare_to(old, "traceback")[:top]:
        if stat.size_diff <= 0:
            break
        print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
        for line in stat.traceback.format(most_recent_first=True)[:12]:
            print("     ", line)


async def main(cycles: int, tasks: int, frames: int) -> None:
    work = fresh_dir(Path("/tmp/memdiag-work"))
    profiles = profiles_dir(work / "profiles", [MODEL])
    diags: list[dict[str, Any]] = []
    with Vendor(time_scale=1.0, quota=QUOTA) as vendor:
        env = service_env(profiles, vendor.url, time_scale=1.0, concurrency={PROVIDER: QUOTA})
        env = {**env, "BENCH_MEMDIAG": "1", "BENCH_TRACEMALLOC": str(frames)}
        with ServiceProc(work / "state", env, work / "service.log", "bench.service_child") as svc:
            print(f"idle RSS {await _settle(svc):.1f} MB", flush=True)
            async with svc.async_client(limit=4, timeout_s=300) as client:
                for cycle in range(cycles):
                    t0 = time.monotonic()
                    await call(
                        client, "POST", f"/v1/accounts/{PROVIDER}/disable", json={"reason": "diag"}
                    )
                    ids, _ = await _submit(client, tasks, cycle)
                    pending = await _settle(svc)
                    await call(client, "POST", f"/v1/accounts/{PROVIDER}/enable")
                    drain = await _drain(svc, client, len(ids), timeout_s=600)
                    after = await _settle(svc)
                    stats = svc.child_stats(timeout_s=120)
                    svc.forget_child_stats()
                    diag = stats["memdiag"]
                    diag["rss_mb"] = svc.rss_mb()
                    diags.append(diag)
                    alloc = {
                        k: v
                        for k, v in diag.items()
                        if k.startswith(("pymalloc", "glibc", "rss", "sqlite"))
                    }
                    print(f"  blocks {diag['allocated_blocks']:,}, {alloc}")
                    for line in diag["biggest"]:
                        print("   ", line)
                    print(
                        f"cycle {cycle + 1}: pending {pending:.1f} MB, after drain {after:.1f} MB "
                        f"(after the dump {diag['rss_mb']:.1f}), traced "
                        f"{diag.get('traced_mb', float('nan')):.2f} MB, drain "
                        f"{drain['seconds']:.0f} s, cycle {time.monotonic() - t0:.0f} s",
                        flush=True,
                    )
                    if len(diags) > 1:
                        print(
                            "  types grown:",
                            _type_growth(diags[-2]["objects_by_type"], diag["objects_by_type"]),
                        )
    for i in range(1, len(diags)):
        if "snapshot" in diags[i]:
            print(f"\n== sites grown from drain {i} to drain {i + 1}")
            _site_growth(diags[i - 1]["snapshot"], diags[i]["snapshot"], top=6)
    if len(diags) > 2 and "snapshot" in diags[1]:
        print(f"\n== sites grown from drain 2 to drain {len(diags)}")
        _site_growth(diags[1]["snapshot"], diags[-1]["snapshot"], top=15)
    if len(diags) > 2:
        print("\n== types grown from drain 2 to the last:")
        print(" ", _type_growth(diags[1]["objects_by_type"], diags[-1]["objects_by_type"], 25))


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(args[0], args[1], args[2] if len(args) > 2 else 0))
