"""Memory for decoding reference images: a byte budget shared by all decodes.

A compressed picture is small on the wire and huge in memory: a 248 KB PNG
of 7,990 x 7,990 decodes to 190 MB, and the conversions and resampling that
follow make several copies. What a decode will take is known from the
header before a pixel is decoded: width x height x channels (3 for RGB, 4
when the picture has alpha, as every picture is worked on in RGB or RGBA).

* One picture over `MAX_DECODE_BYTES` is refused (`InputError`, a 400 at
  submit) naming the budget.
* Decodes run together only while their costs fit the budget together; a
  large one waits for the others and runs alone. Callers run decoding work
  through `in_decode_thread`: its own few threads, so decodes waiting for
  the budget never take the threads the rest of the service uses
  (`asyncio.to_thread`).
* When the last decode ends, freed memory is given back to the system
  (glibc keeps freed blocks in per-thread arenas otherwise, and the service
  stays at its peak for good).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import ctypes.util
import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from PIL import Image

from dispatcher.errors import InputError

# A 50 MP RGB photo (the largest common camera sensors) fits; a 64 MP one,
# or a 45 MP picture with alpha, does not.
MAX_DECODE_BYTES = 160 * 1024 * 1024
# Below this, a decode's memory is not worth a trim.
_TRIM_FROM_BYTES = 8 * 1024 * 1024
# Threads that decode: one working and one waiting is enough on any number
# of cores, since a large decode runs alone anyway.
DECODE_THREADS = 2

P = ParamSpec("P")
T = TypeVar("T")
_POOL = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="decode")


def decode_cost(img: Image.Image) -> int:
    """Bytes of `img`'s pixels once decoded and made RGB(A): width x height x channels."""
    alpha = "A" in img.getbands() or "transparency" in img.info
    return img.width * img.height * (4 if alpha else 3)


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc: its allocator gives memory back itself
        return None
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _malloc_trim()


def give_back() -> None:
    """Return freed heap memory to the system (glibc's malloc_trim)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class DecodeGate:
    """Decodes in progress, by their cost; see the module doc."""

    def __init__(self, max_bytes: int = MAX_DECODE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.in_use = 0
        self.largest = 0  # the most bytes ever held at once (for tests and figures)
        self._since_trim = 0
        self._cond = threading.Condition()

    def check(self, cost: int, param: str, what: str) -> None:
        if cost > self.max_bytes:
            raise InputError(
                f"{param}: decoding {what} takes {cost:,} bytes of memory "
                f"(width x height x channels); the decode budget is {self.max_bytes:,} bytes"
            )

    @contextlib.contextmanager
    def hold(self, cost: int, param: str, what: str) -> Iterator[None]:
        """Run a decode of `cost` bytes once it fits; refuse it if it never can."""
        self.check(cost, param, what)
        with self._cond:
            self._cond.wait_for(lambda: self.in_use + cost <= self.max_bytes)
            self.in_use += cost
            self.largest = max(self.largest, self.in_use)
        try:
            yield
        finally:
            with self._cond:
                self.in_use -= cost
                self._since_trim += cost
                trim = self.in_use == 0 and self._since_trim >= _TRIM_FROM_BYTES
                if trim:
                    self._since_trim = 0
                self._cond.notify_all()
            if trim:
                give_back()


# The one gate of the process: every reference decode (fingerprints at
# submit, preparation before a send) shares it.
GATE = DecodeGate()


async def in_decode_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`asyncio.to_thread` for work that decodes images, on the decode threads."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_POOL, call)
