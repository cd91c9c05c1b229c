"""A web task's reference images, read and checked once, ready to attach.

The page gets the encoded image as the file a person would pick (no
re-encoding: a chat page does its own), read only from the input dirs or a
``data:`` URL / base64 exactly as the fingerprint reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.errors import InputError, PermanentError
from dispatcher.profile_calls import ReferenceSpec
from dispatcher.refimages import Prepared, prepare
from dispatcher.tasks.decodebudget import in_decode_thread
from dispatcher.tasks.fingerprint import REFERENCE_IMAGE, REFERENCE_IMAGES, LocalFiles, read_image


def _refs(params: Mapping[str, Any]) -> list[tuple[str, Any]]:
    refs: list[tuple[str, Any]] = []
    if params.get(REFERENCE_IMAGE) is not None:
        refs.append((REFERENCE_IMAGE, params[REFERENCE_IMAGE]))
    many = params.get(REFERENCE_IMAGES)
    if isinstance(many, list):
        refs.extend((f"{REFERENCE_IMAGES}[{i}]", ref) for i, ref in enumerate(many))
    return refs


def _load(refs: list[tuple[str, Any]], files: LocalFiles) -> list[Prepared]:
    return [prepare(read_image(ref, param, files), ReferenceSpec(), param) for param, ref in refs]


async def load_references(
    params: Mapping[str, Any], files: LocalFiles, *, can_attach: bool
) -> list[Prepared]:
    """The task's images (read off the event loop); a clear error when the
    page cannot take them, rather than a generation without its reference."""
    refs = _refs(params)
    if not refs:
        return []
    if not can_attach:
        raise PermanentError(
            "this web model cannot take reference images: its profile declares no "
            "`upload` selector",
            kind="input",
        )
    try:
        return await in_decode_thread(_load, refs, files)
    except InputError as exc:
        raise PermanentError(str(exc), kind="input") from exc
