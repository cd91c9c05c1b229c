"""Serve every vendor stand-in by hand (docs/vendors.md, "Try it offline"):

    python -m tests.vendors [PORT]

prints the variables that point the catalog profiles at it, and serves
until Ctrl-C. The key every stand-in accepts is printed too."""

from __future__ import annotations

import asyncio
import contextlib
import sys

from tests.vendors.catalog_a import VENDORS_A
from tests.vendors.catalog_b import KLING_SECRET, VENDORS_B
from tests.vendors.standin import BASE_ENV, KEY, start_standin


async def main(port: int | None) -> None:
    server, state = await start_standin([*VENDORS_A, *VENDORS_B], port)
    state.hold = False  # by hand, a HOLD prompt finishes like any other
    for vendor, variable in BASE_ENV.items():
        print(f"export {variable}={server.url}/{vendor}")
    print(f"# every key: {KEY}   (KLING_SECRET_KEY={KLING_SECRET})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else None))
