"""Which event loop a process runs on: uvloop when it is installed, else asyncio's.

The service is one event loop serving HTTP, the scheduler and every provider
call; uvloop runs the same coroutines with less CPU per wake-up, socket read
and timer (libuv in C instead of the selector loop in Python). It is what
uvicorn's own "standard" install runs. `DISPATCHER_EVENT_LOOP=asyncio` keeps
the standard library's loop, should a platform or a library misbehave on
uvloop; `uvloop` insists on it (start-up fails when it is missing).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from dispatcher.errors import ConfigError

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
EVENT_LOOPS: tuple[EventLoopChoice, ...] = ("auto", "uvloop", "asyncio")

T = TypeVar("T")


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory `asyncio.Runner` takes for `choice`; None is asyncio's own loop."""
    if choice not in EVENT_LOOPS:
        raise ConfigError(f"event loop must be one of {', '.join(EVENT_LOOPS)}, not {choice!r}")
    if choice == "asyncio" or (choice == "auto" and not uvloop_available()):
        return None
    try:
        import uvloop
    except ImportError as exc:
        raise ConfigError(f"event loop uvloop asked for, but it cannot be imported: {exc}") from exc
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """`asyncio.run(main)` on the chosen loop."""
    try:
        factory = loop_factory(choice)
    except ConfigError:
        main.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """`uvloop` or `asyncio`: what a running process reports it runs on."""
    running = loop if loop is not None else asyncio.get_running_loop()
    return "uvloop" if type(running).__module__.startswith("uvloop") else "asyncio"
