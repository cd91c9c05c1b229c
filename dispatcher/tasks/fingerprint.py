"""Task fingerprints: what makes two tasks "the same generation".

A fingerprint is the sha256 of canonical JSON (sorted keys at every depth,
compact separators, UTF-8 kept as is) of::

    {"model": <model name>,
     "fields": {<the profile's fingerprint fields present in params>},
     "images": {"reference_image": <hash>, "reference_images": [<hash>, ...]}}

Conventions (the one place they are decided):

* ``prompt`` and ``negative_prompt`` are normalised with `normalize_prompt`
  before they count, so copy-paste noise (full-width characters, zero-width
  joiners, doubled spaces) does not defeat de-duplication and the cache.
* Reference images come from ``params["reference_image"]`` (one image) and
  ``params["reference_images"]`` (a list). Each is a file path, a ``data:``
  URL, a base64 string or an http(s) URL (counted by the URL's text, see
  `image_hash`). Their pixel hashes always count, whether or not
  the profile lists them, because a different picture is a different
  generation; their raw strings never count, because a re-encoded copy of
  the same picture must match. The two keys are kept apart (and lists keep
  their order) because a profile's request body may use only one of them, so
  the same picture under the other key is not the same request.
* Every other param outside the profile's list (request ids, timestamps, the
  UI that sent it) is ignored.

Image hashes depend on Pillow's resampling code; a Pillow upgrade that changes
it only costs cache misses, never wrong hits between different pictures.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import io
import json
import os
import re
import stat
import unicodedata
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from PIL import Image, ImageSequence, UnidentifiedImageError

from dispatcher.errors import InputError
from dispatcher.tasks.decodebudget import GATE, decode_cost

PROMPT_FIELDS = frozenset({"prompt", "negative_prompt"})
REFERENCE_IMAGE = "reference_image"
REFERENCE_IMAGES = "reference_images"
IMAGE_PARAMS = frozenset({REFERENCE_IMAGE, REFERENCE_IMAGES})

# Zero-width space, non-joiner, joiner, word joiner and BOM: invisible, so two
# prompts differing only by them look identical to the person who sent them.
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))
_WHITESPACE = re.compile(r"\s+")

HASH_LONG_EDGE = 512
# LANCZOS is deterministic and keeps enough detail at 512 px that visibly
# different pictures keep different hashes.
_RESAMPLE = Image.Resampling.LANCZOS
# Only decoders for formats people actually send as references: Pillow would
# otherwise also try formats such as EPS, which shells out to Ghostscript.
_ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF", "AVIF")
# Below Pillow's own decompression-bomb warning (~89 MP), so an oversized
# picture is a clear InputError rather than a warning or a MemoryError.
MAX_IMAGE_PIXELS = 64_000_000
MAX_IMAGE_FRAMES = 500
# Decoding work over all frames: an animation of many huge frames is refused
# before it ties up a CPU for minutes.
MAX_DECODED_PIXELS = 4 * MAX_IMAGE_PIXELS
# A path is at most this long; anything longer can only be base64.
_MAX_PATH_CHARS = 4096


def normalize_prompt(text: str) -> str:
    """NFKC, zero-width characters removed, whitespace runs collapsed, ends trimmed."""
    # NFKC first: it maps full-width letters and the ideographic space to their
    # ASCII forms, so the whitespace collapse below sees them as what they are.
    text = unicodedata.normalize("NFKC", text).translate(_ZERO_WIDTH)
    return _WHITESPACE.sub(" ", text).strip()


def _decode_base64(data: str, param: str, problem: str) -> bytes:
    compact = "".join(data.split())  # base64 pasted from a terminal wraps lines
    compact += "=" * (-len(compact) % 4)  # tolerate stripped padding
    # The URL-safe alphabet is accepted too; validate=True refuses anything
    # else instead of silently dropping it.
    compact = compact.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(compact.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise InputError(f"{param}: {problem}") from exc


def _decode_data_url(url: str, param: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep:
        raise InputError(f"{param}: malformed data: URL (no comma before the data)")
    if header.lower().endswith(";base64"):
        return _decode_base64(payload, param, "the data: URL's payload is not valid base64")
    return urllib.parse.unquote_to_bytes(payload)


@dataclass(frozen=True)
class LocalFiles:
    """Where local reference images may be read from, and how large they may be.

    A path is honoured only when the file it resolves to (symlinks followed)
    lies under one of `dirs`; relative paths are looked up in each dir in turn.
    Everything else that fails (outside the dirs, missing, a symlink leading
    out, a directory, unreadable) gets one and the same message, so the
    answers cannot be used to map the machine's files.
    """

    given: tuple[Path, ...]
    max_bytes: int

    @classmethod
    def under(cls, dirs: Sequence[Path], max_bytes: int) -> LocalFiles:
        # Built for every attempt: a Path given is kept, not parsed again.
        return cls(tuple(d if isinstance(d, Path) else Path(d) for d in dirs), max_bytes)

    @functools.cached_property
    def dirs(self) -> tuple[Path, ...]:
        """The dirs, symlinks resolved, on first use: every attempt builds a
        LocalFiles, few read a file, and resolving costs a syscall per part."""
        return tuple(d.resolve() for d in self.given)

    def find(self, text: str) -> Path | None:
        """The regular file `text` names inside the dirs, or None."""
        candidate = Path(text)
        tries = [candidate] if candidate.is_absolute() else [d / candidate for d in self.dirs]
        for path in tries:
            try:
                real = path.resolve(strict=True)
                inside = any(real.is_relative_to(d) for d in self.dirs)
                if inside and stat.S_ISREG(real.stat().st_mode):
                    return real
            except (OSError, RuntimeError, ValueError):
                continue  # missing, a symlink loop, a NUL in the name
        return None

    def read(self, path: Path, param: str) -> bytes:
        """The file's bytes, refused by size before anything is read."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise InputError(_not_available(param)) from exc
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InputError(_not_available(param))
            if info.st_size > self.max_bytes:
                raise InputError(_too_large(param, info.st_size, self.max_bytes))
            try:
                data = handle.read(self.max_bytes + 1)
            except OSError as exc:
                raise InputError(_not_available(param)) from exc
        if len(data) > self.max_bytes:  # it grew while we looked
            raise InputError(_too_large(param, len(data), self.max_bytes))
        return data


def _not_available(param: str) -> str:
    return (
        f"{param}: no readable image file at that path in the input dirs "
        "(DISPATCHER_INPUT_DIRS); put the file there, or send a data: URL or base64 data"
    )


def _too_large(param: str, size: int, cap: int) -> str:
    return (
        f"{param}: image file is {size:,} bytes "
        f"(at most {cap:,}; see DISPATCHER_MAX_REFERENCE_IMAGE_BYTES)"
    )


def _looks_like_path(text: str) -> bool:
    """Whether a failed reference was meant as a path (base64 has no "." and no "~")."""
    last = text.rsplit("/", 1)[-1]
    return text.startswith(("/", ".", "~")) or "." in last


def _image_bytes(ref: str | bytes, param: str, files: LocalFiles | None) -> tuple[bytes, str]:
    """The encoded image, and what it was (for error messages)."""
    if isinstance(ref, bytes | bytearray | memoryview):
        return bytes(ref), "the image data"
    if not isinstance(ref, str):
        raise InputError(
            f"{param}: expected a file path, data: URL or base64 string, got {type(ref).__name__}"
        )
    text = ref.strip()
    if not text:
        raise InputError(f"{param}: empty image reference")
    lowered = text[:16].lower()
    if lowered.startswith("data:"):
        return _decode_data_url(text, param), "the data: URL"
    if lowered.startswith("file://"):
        path = urllib.parse.unquote(urllib.parse.urlparse(text).path)
        found = files.find(path) if files else None
        if files is None or found is None:
            raise InputError(_not_available(param))
        return files.read(found, param), "the file"
    if lowered.startswith(("http://", "https://")):
        # The bytes behind a URL are fetched only by a runner that needs them,
        # through the fetch path (`apirunner.refsend`); reading one here
        # would be a remote request from wherever this is called.
        raise InputError(
            f"{param}: a remote URL cannot be read here; "
            "send a file path, a data: URL or base64 data"
        )
    single_line = len(text) <= _MAX_PATH_CHARS and "\n" not in text
    found = files.find(text) if files and single_line else None
    if files is not None and found is not None:
        return files.read(found, param), "the file"
    # Not a file we may read: the only reading left is base64. A path that is
    # not allowed (or not there) gets the one message for both.
    if single_line and _looks_like_path(text):
        try:
            data = _decode_base64(text, param, "")
        except InputError:
            raise InputError(_not_available(param)) from None
        if not _is_image(data):
            raise InputError(_not_available(param))
        return data, "the value (read as base64)"
    problem = "not a file in the input dirs, a data: URL or base64 image data"
    return _decode_base64(text, param, problem), "the value (read as base64)"


def is_remote(ref: Any) -> bool:
    """Whether a reference is an http(s) URL (identified by its text, fetched only by runners)."""
    return isinstance(ref, str) and ref.strip()[:8].lower().startswith(("http://", "https://"))


def _is_image(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data), formats=_usable_formats()):
            return True
    except Exception:
        return False


def read_image(ref: str | bytes, param: str, files: LocalFiles | None) -> bytes:
    """The encoded image a reference names (path within `files`, data: URL,
    base64), to upload. Reads: call it off the event loop."""
    return _image_bytes(ref, param, files)[0]


def _normalized_frame(frame: Image.Image, *, owned: bool) -> Image.Image:
    """RGB, or RGBA when some pixel is not fully opaque, scaled to 512 px on the long edge.

    Full-size copies are what a large picture costs: none is made that the
    result does not need. `owned`: `frame` may be changed in place (it is
    not an animation's canvas that the next frame is drawn on).
    """
    has_alpha = "A" in frame.getbands() or "transparency" in frame.info
    target = "RGBA" if has_alpha else "RGB"
    img = frame if frame.mode == target else frame.convert(target)
    if img.mode == "RGBA":
        # Per band (RGBA: four (min, max) pairs), without the full-size copy
        # `getchannel` would make.
        bands = cast("tuple[tuple[int, int], ...]", img.getextrema())
        low = bands[3][0]
        if low == 255:
            # A PNG with an all-opaque alpha channel shows the same picture as
            # its BMP/JPEG copy without one; hash them the same.
            img = img.convert("RGB")
        else:
            # The colour under a fully transparent pixel is invisible and
            # encoders (WebP lossless) discard it; zero it so it cannot count.
            if img is frame and not owned:
                img = img.copy()
            hidden = img.getchannel("A").point(lambda a: 0 if a else 255)
            img.paste((0, 0, 0, 0), mask=hidden)
    width, height = img.size
    scale = HASH_LONG_EDGE / max(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return img.resize(size, _RESAMPLE)


def _frames(img: Image.Image, param: str) -> Iterator[Image.Image]:
    count = int(getattr(img, "n_frames", 1))
    if count > MAX_IMAGE_FRAMES:
        raise InputError(f"{param}: animation has {count} frames (at most {MAX_IMAGE_FRAMES})")
    if count * img.width * img.height > MAX_DECODED_PIXELS:
        raise InputError(
            f"{param}: animation of {count} frames of {img.width}x{img.height} is too large"
        )
    if count == 1:
        yield img
        return
    # Every frame counts: two animations sharing only their first frame are
    # different references.
    yield from ImageSequence.Iterator(img)


def image_hash(
    ref: str | bytes, *, param: str = REFERENCE_IMAGE, files: LocalFiles | None = None
) -> str:
    """sha256 hex of an image's pixels, insensitive to metadata and lossless re-encoding.

    `ref` is raw image bytes, a file path (read only within `files`; without
    it no local file is read), a ``data:`` URL or base64 data. This reads and
    decodes: call it off the event loop.
    Pixels are taken as stored (EXIF orientation is metadata and is ignored),
    converted to RGB(A) and scaled so the long edge is 512 px. Anything that
    is not a readable image raises `InputError` naming `param`.
    """
    if is_remote(ref):
        # Identified by the URL itself: fetching it at submit time would be a
        # remote request before the task even runs. The cost: a picture
        # replaced behind the same URL is a cache hit; vendors' and CDNs'
        # URLs change with their content, and `force` skips the cache.
        return "url:" + hashlib.sha256(str(ref).strip().encode("utf-8")).hexdigest()
    data, source = _image_bytes(ref, param, files)
    try:
        with Image.open(io.BytesIO(data), formats=_usable_formats()) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise InputError(
                    f"{param}: image is {width}x{height} pixels "
                    f"(at most {MAX_IMAGE_PIXELS:,} pixels)"
                )
            cost = decode_cost(img)
        # Decoded in a call of its own: when it returns, every copy of the
        # pixels is gone, and the gate can give their memory back.
        with GATE.hold(cost, param, f"{source} ({width}x{height})"):
            return _pixel_digest(data, param)
    except InputError:
        raise
    except UnidentifiedImageError as exc:
        # Pillow's own text names the BytesIO object, which helps nobody.
        raise InputError(
            f"{param}: {source} is not an image in a supported format "
            f"({', '.join(_ALLOWED_FORMATS)})"
        ) from exc
    except Exception as exc:
        # Pillow's decoders report corrupt input with a zoo of exception types
        # (OSError, SyntaxError, ValueError, struct.error, EOFError...); all of
        # them mean the same thing to the caller.
        raise InputError(f"{param}: {source} is not a readable image ({exc})") from exc


def _pixel_digest(data: bytes, param: str) -> str:
    digest = hashlib.sha256()
    with Image.open(io.BytesIO(data), formats=_usable_formats()) as img:
        owned = int(getattr(img, "n_frames", 1)) == 1
        for frame in _frames(img, param):
            norm = _normalized_frame(frame, owned=owned)
            w, h = norm.size
            # Mode and size go in too, so pixel bytes of differently shaped
            # frames can never concatenate to the same stream.
            digest.update(f"{norm.mode}:{w}x{h}:".encode())
            digest.update(norm.tobytes())
    return digest.hexdigest()


def _usable_formats() -> list[str]:
    Image.init()  # registers every plugin once, so OPEN is complete
    return [name for name in _ALLOWED_FORMATS if name in Image.OPEN]


def has_references(params: Mapping[str, Any]) -> bool:
    """Whether `params` name any reference image (so hashing them means work)."""
    return any(params.get(key) is not None for key in IMAGE_PARAMS)


def reference_hashes(params: Mapping[str, Any], files: LocalFiles | None = None) -> dict[str, Any]:
    """The pixel hashes of the reference images in `params` (reads files: off the loop)."""
    images: dict[str, Any] = {}
    if params.get(REFERENCE_IMAGE) is not None:
        images[REFERENCE_IMAGE] = image_hash(
            params[REFERENCE_IMAGE], param=REFERENCE_IMAGE, files=files
        )
    refs = params.get(REFERENCE_IMAGES)
    if refs is None:
        return images
    if isinstance(refs, str | bytes) or not isinstance(refs, Sequence):
        raise InputError(
            f"{REFERENCE_IMAGES}: expected a list of file paths, data: URLs or base64 strings"
        )
    if refs:  # an empty list asks for no images, like an absent key
        images[REFERENCE_IMAGES] = [
            image_hash(ref, param=f"{REFERENCE_IMAGES}[{i}]", files=files)
            for i, ref in enumerate(refs)
        ]
    return images


def canonical_json(value: Any) -> str:
    """Sorted keys at every depth, no spaces, non-ASCII kept, NaN refused."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _is_json(value: Any) -> bool:
    try:
        canonical_json(value)
    except (TypeError, ValueError):
        return False
    return True


def fingerprint(
    model: str,
    params: Mapping[str, Any],
    fields: Sequence[str],
    *,
    images: Mapping[str, Any] | None = None,
    files: LocalFiles | None = None,
) -> str:
    """sha256 hex identifying the generation `params` ask of `model` (see module doc).

    `images` are the `reference_hashes` of `params`, computed beforehand (off
    the event loop); without them they are computed here, reading local
    files only within `files`.
    """
    chosen: dict[str, Any] = {}
    for name in fields:
        if name in IMAGE_PARAMS or name not in params:
            continue  # images count through their pixel hashes below
        value = params[name]
        if name in PROMPT_FIELDS and isinstance(value, str):
            value = normalize_prompt(value)
        chosen[name] = value
    if images is None:
        images = reference_hashes(params, files)
    doc = {"model": model, "fields": chosen, "images": dict(images)}
    try:
        encoded = canonical_json(doc)
    except (TypeError, ValueError) as exc:
        # Name the culprit: the message goes back to whoever sent the task.
        culprit = next((k for k in chosen if not _is_json(chosen[k])), "params")
        raise InputError(f"{culprit}: not a plain JSON value ({exc})") from exc
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def graph_fingerprint(model: str, graph: Mapping[str, Any], image_hashes: Mapping[str, Any]) -> str:
    """sha256 hex of a filled-in ComfyUI graph: the whole request, so any change
    to any node is a different generation. Reference images count by their
    pixel hashes (computed beforehand, off the loop), under the parameter that
    names them (see the module doc)."""
    doc = {"model": model, "graph": graph, "images": dict(image_hashes)}
    try:
        encoded = canonical_json(doc)
    except (TypeError, ValueError) as exc:
        raise InputError(f"params: not plain JSON values ({exc})") from exc
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()
