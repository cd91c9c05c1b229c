"""Run a bundled demo backend on its own: `python -m demo api|web|comfyui [--port N]`.

Useful to keep a "vendor" alive across dispatcher restarts (the kill -9 tests
do exactly that) or to point your own profiles at a stand-in.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from dispatcher.service import eventloop


async def _serve(kind: str, port: int | None, time_scale: float, quota: int) -> None:
    if kind == "api":
        from demo.api_provider import start_demo_api

        server = await start_demo_api(port=port, time_scale=time_scale, quota=quota)
    elif kind == "comfyui":
        from demo.comfyui import start_demo_comfy

        server = await start_demo_comfy(port=port, time_scale=time_scale)
    else:
        from demo.web_model import start_demo_web

        server = await start_demo_web(port=port, time_scale=time_scale)
    print(server.url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("kind", choices=["api", "web", "comfyui"])
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--quota", type=int, default=3, help="API concurrency quota per key")
    args = parser.parse_args(argv)
    # The service's loop setting, so that a stand-in vendor runs like it.
    choice = os.environ.get("DISPATCHER_EVENT_LOOP", "auto")
    eventloop.run(_serve(args.kind, args.port, args.time_scale, args.quota), choice)
    return 0


if __name__ == "__main__":
    sys.exit(main())
