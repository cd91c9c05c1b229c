"""Reference images on their way to a vendor: prepared once, uploaded once.

`prepare` turns an image's encoded bytes into what the profile's
``[api.references]`` asks for (long edge, format, byte cap): pure CPU work,
run in a thread. `PreparedImages` caches its results in memory, bounded,
keyed by the source bytes' sha256 and the preparation, so the format check
and resizing are not redone for every task that shares a picture.
`UploadCache` remembers, per provider, the id a vendor gave each uploaded
image (keyed by the sha256 of the bytes actually sent) for the profile's
`upload_ttl_s`; tasks that need an image while its upload is in flight wait
for that one upload instead of starting their own.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from PIL import Image, UnidentifiedImageError

from dispatcher.clock import Clock
from dispatcher.errors import InputError
from dispatcher.profile_calls import ReferenceSpec
from dispatcher.tasks.decodebudget import GATE, decode_cost, in_decode_thread
from dispatcher.tasks.fingerprint import MAX_IMAGE_PIXELS, LocalFiles, read_image

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
_EXT = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif"}
_SEND_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
# What a source image may be; the same families the fingerprint decodes.
_OPEN_FORMATS = ["PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF"]
# Each try to meet max_bytes scales the long edge by this much.
_SHRINK = 0.8
_SHRINK_TRIES = 12
# The prepared-image cache holds at most this many bytes in total.
PREPARED_CACHE_BYTES = 128 * 1024**2


@dataclass(frozen=True)
class Prepared:
    """An image exactly as it will be sent."""

    data: bytes
    mime: str
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.sha256[:16]}.{_EXT.get(self.mime, 'bin')}"

    @property
    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    @property
    def data_url(self) -> str:
        return f"data:{self.mime};base64,{self.base64}"


def _prepared(data: bytes, mime: str) -> Prepared:
    return Prepared(data, mime, hashlib.sha256(data).hexdigest())


def _encode(img: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    if fmt == "JPEG" and img.mode not in ("RGB", "L"):
        img = img.convert("RGB")  # JPEG has no alpha: flattened, as vendors do
    elif fmt != "JPEG" and img.mode not in ("RGB", "RGBA", "L", "LA"):
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    img.save(out, fmt, **({"quality": 90} if fmt in ("JPEG", "WEBP") else {}))
    return out.getvalue()


def _scaled(img: Image.Image, edge_px: int) -> Image.Image:
    width, height = img.size
    if max(width, height) <= edge_px:
        return img
    scale = edge_px / max(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return img.resize(size, Image.Resampling.LANCZOS)


def prepare(data: bytes, spec: ReferenceSpec, param: str) -> Prepared:
    """The image as `spec` wants it sent; the source bytes untouched when they
    already fit. Decodes: call it off the event loop. Not an image, or too
    large to fit `max_bytes`: `InputError` naming `param`."""
    try:
        with Image.open(io.BytesIO(data), formats=_OPEN_FORMATS) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise InputError(f"{param}: image is {width}x{height} pixels (too many)")
            cost = decode_cost(img)
        # Decoded in a call of its own: when it returns, every copy of the
        # pixels is gone, and the gate can give their memory back.
        with GATE.hold(cost, param, f"the {width}x{height} image"):
            return _prepare_decoded(data, spec, param)
    except InputError:
        raise
    except UnidentifiedImageError as exc:
        raise InputError(f"{param}: not an image in a supported format") from exc
    except Exception as exc:  # Pillow reports corrupt data with many exception types
        raise InputError(f"{param}: not a readable image ({exc})") from exc


def _prepare_decoded(data: bytes, spec: ReferenceSpec, param: str) -> Prepared:
    with Image.open(io.BytesIO(data), formats=_OPEN_FORMATS) as img:
        return _prepare_open(img, data, spec, param)


def _prepare_open(img: Image.Image, data: bytes, spec: ReferenceSpec, param: str) -> Prepared:
    width, height = img.size
    source = img.format or ""
    target = _SEND_FORMATS[spec.format] if spec.format else source
    if target not in _SEND_FORMATS.values() and source not in _MIME:
        target = "PNG"  # BMP, TIFF: not what vendors take; PNG keeps every pixel
    edge = max(width, height)
    if spec.max_edge_px is not None:
        edge = min(edge, spec.max_edge_px)
    fits = spec.max_bytes is None or len(data) <= spec.max_bytes
    if target == source and edge == max(width, height) and fits:
        img.verify()  # decodable to the end, not just a header
        return _prepared(data, _MIME[source])
    img.load()
    for _ in range(_SHRINK_TRIES):
        encoded = _encode(_scaled(img, edge), target)
        if spec.max_bytes is None or len(encoded) <= spec.max_bytes:
            return _prepared(encoded, _MIME[target])
        edge = max(16, int(edge * _SHRINK))
    raise InputError(f"{param}: cannot be made smaller than max_bytes = {spec.max_bytes}")


def _spec_key(spec: ReferenceSpec) -> tuple[Any, ...]:
    return (spec.max_edge_px, spec.format, spec.max_bytes)


class _Flights(Generic[K, V]):
    """At most one computation per key at a time; latecomers await it."""

    def __init__(self) -> None:
        self._running: dict[K, asyncio.Future[V]] = {}

    async def run(self, key: K, work: Callable[[], Awaitable[V]]) -> V:
        running = self._running.get(key)
        if running is not None:
            # shield: one waiter being canceled must not cancel the others' result.
            return await asyncio.shield(running)
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            value = await work()
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # marked as read: waiters get it, nobody else must
            else:
                future.cancel()
            raise
        else:
            future.set_result(value)
            return value
        finally:
            del self._running[key]


class PreparedImages:
    """Prepared images by (source sha256, preparation), least recently used out first."""

    def __init__(self, max_bytes: int = PREPARED_CACHE_BYTES) -> None:
        self._max_bytes = max_bytes
        self._held = 0
        self._cache: OrderedDict[tuple[Any, ...], Prepared] = OrderedDict()
        self._flights: _Flights[tuple[Any, ...], Prepared] = _Flights()
        self.prepared = 0  # preparations actually run (the rest were cache hits)

    async def get(self, ref: Any, param: str, files: LocalFiles, spec: ReferenceSpec) -> Prepared:
        """`ref` (path in the input dirs, data: URL, base64) read and prepared, off the loop."""
        source = await asyncio.to_thread(read_image, ref, param, files)
        return await self.from_bytes(source, param, spec)

    async def from_bytes(self, source: bytes, param: str, spec: ReferenceSpec) -> Prepared:
        """An image already in hand (fetched from a URL) prepared, off the loop."""
        key = (hashlib.sha256(source).hexdigest(), *_spec_key(spec))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit

        async def work() -> Prepared:
            prepared = await in_decode_thread(prepare, source, spec, param)
            self.prepared += 1
            self._remember(key, prepared)
            return prepared

        return await self._flights.run(key, work)

    def _remember(self, key: tuple[Any, ...], prepared: Prepared) -> None:
        if len(prepared.data) > self._max_bytes:
            return
        self._cache[key] = prepared
        self._held += len(prepared.data)
        while self._held > self._max_bytes:
            _, old = self._cache.popitem(last=False)
            self._held -= len(old.data)


@dataclass(frozen=True)
class _Upload:
    value: Any  # what the vendor's answer gave: an id or a URL
    expires_at: float  # clock.monotonic()


class UploadCache:
    """One provider's uploaded images: what each upload answered, until its TTL."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._entries: dict[tuple[str, str], _Upload] = {}
        self._flights: _Flights[tuple[str, str], Any] = _Flights()

    async def get(
        self,
        endpoint: str,
        image: Prepared,
        ttl_s: float,
        upload: Callable[[], Awaitable[Any]],
    ) -> tuple[Any, bool]:
        """The upload's id, and whether this call made the upload."""
        key = (endpoint, image.sha256)
        entry = self._entries.get(key)
        if entry is not None and self._clock.monotonic() < entry.expires_at:
            return entry.value, False
        made = False

        async def work() -> Any:
            nonlocal made
            value = await upload()
            made = True
            expires = self._clock.monotonic() + self._clock.scaled(ttl_s)
            self._entries[key] = _Upload(value, expires)
            return value

        value = await self._flights.run(key, work)
        return value, made

    def forget(self, endpoint: str, image: Prepared, value: Any) -> None:
        """The vendor refused `value`: the next task uploads again (unless one did already)."""
        key = (endpoint, image.sha256)
        entry = self._entries.get(key)
        if entry is not None and entry.value == value:
            del self._entries[key]
