"""What a submit needs of a task's reference images, in the profile's shape.

Three shapes (docs/how-it-works.md, "Reference images reach the model"):

- *inline*: ``{reference_image:data_url}``, ``{reference_image:base64}`` or
  ``{reference_image:url}`` (an http(s) URL passed through) in the body;
- *multipart submit*: ``[api.references] multipart_field``, the image as a
  file part of a ``multipart/form-data`` submit;
- *upload first*: ``[api.upload]``, then ``{reference_image:upload}`` in the
  body is the id (or URL) the upload's answer gave.

`ReferenceSender.build` prepares (cached) and uploads (once per image per
provider, see `UploadCache`) and hands back the placeholder values and file
parts; the runner renders and sends the submit.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from apirunner.classify import bad_answer
from apirunner.client import Answer, Call, CallFailed
from apirunner.templates import format_path, is_url, join_url, lookup, placeholders
from dispatcher.errors import InputError, PermanentError
from dispatcher.profiles import ApiSpec
from dispatcher.refimages import Prepared, PreparedImages, UploadCache
from dispatcher.scheduling.protocol import ResultFile
from dispatcher.tasks.fingerprint import IMAGE_PARAMS, REFERENCE_IMAGE, REFERENCE_IMAGES, LocalFiles

FORMS = ("data_url", "base64", "url", "upload")


@dataclass
class SubmitImages:
    values: dict[str, Any] = field(default_factory=dict)  # "reference_image:data_url" -> ...
    files: dict[str, tuple[str, bytes, str]] = field(default_factory=dict)
    uploaded: list[tuple[Prepared, Any]] = field(default_factory=list)  # (image, its id)


def _input_error(message: str) -> PermanentError:
    return PermanentError(message, kind="input")


# `image_needs` per profile spec: every attempt asks, and walking the body
# template each time was ~1 % of an instant task's CPU. The spec is frozen,
# and held here, so its id cannot be another's while it is cached.
_NEEDS: dict[int, tuple[ApiSpec, frozenset[tuple[str, str]]]] = {}
_NEEDS_MAX = 256


def image_needs(api: ApiSpec) -> set[tuple[str, str]]:
    """The (image param, form) pairs the submit body asks for."""
    hit = _NEEDS.get(id(api))
    if hit is not None and hit[0] is api:
        return set(hit[1])
    needs = _image_needs(api)  # a config error raises: nothing cached
    if len(_NEEDS) >= _NEEDS_MAX:  # profiles reloaded many times: start over
        _NEEDS.clear()
    _NEEDS[id(api)] = (api, frozenset(needs))
    return needs


def _image_needs(api: ApiSpec) -> set[tuple[str, str]]:
    body = api.submit.body or {}
    needs = {(name, form) for name, form in placeholders(body) if name in IMAGE_PARAMS and form}
    for name, form in needs:
        if form not in FORMS:
            raise PermanentError(
                f"{{{name}:{form}}}: unknown form; use one of {', '.join(FORMS)}", kind="config"
            )
        if form == "upload" and api.upload is None:
            raise PermanentError(f"{{{name}:upload}} needs an [api.upload] table", kind="config")
    return needs


class ReferenceSender:
    """One attempt's reference images, turned into what its submit sends."""

    def __init__(
        self,
        api: ApiSpec,
        params: Mapping[str, Any],
        files: LocalFiles,
        prepared: PreparedImages,
        uploads: UploadCache,
        upload: Callable[[Prepared], Awaitable[Any]],
        on_upload: Callable[[], Awaitable[None]],
        fetch: Callable[[str], Awaitable[bytes]],
    ) -> None:
        self._api = api
        self._params = params
        self._files = files
        self._prepared = prepared
        self._uploads = uploads
        self._upload = upload
        self._on_upload = on_upload
        self._fetch = fetch

    @property
    def _endpoint(self) -> str:
        return self._api.upload.path if self._api.upload else ""

    async def _image(self, ref: Any, param: str) -> Prepared:
        spec = self._api.references
        try:
            if is_url(ref):
                # Fetched only now that a shape needs its bytes, through the
                # lane's client: allowlisted hosts only, capped in size.
                source = await self._fetch(str(ref))
                return await self._prepared.from_bytes(source, param, spec)
            return await self._prepared.get(ref, param, self._files, spec)
        except InputError as exc:
            raise _input_error(str(exc)) from exc

    async def _value(self, ref: Any, param: str, form: str, out: SubmitImages) -> Any:
        if form == "url":
            if not is_url(ref):
                raise _input_error(
                    f"{param}: this model takes reference images only as http(s) URLs; "
                    "a local file or data: URL cannot be sent to it"
                )
            return ref
        image = await self._image(ref, param)
        if form == "data_url":
            return image.data_url
        if form == "base64":
            return image.base64
        value, _made = await self._uploads.get(
            self._endpoint,
            image,
            self._api.references.upload_ttl_s,
            lambda: self._upload(image),
        )
        out.uploaded.append((image, value))
        return value

    async def build(self) -> SubmitImages:
        out = SubmitImages()
        needs = image_needs(self._api)
        if any(form == "upload" for _, form in needs) and self._has_images():
            await self._on_upload()
        for name, form in sorted(needs):
            refs = self._params.get(name)
            if refs is None:
                continue  # the key drops out of the body, like any missing param
            if name == REFERENCE_IMAGES:
                if isinstance(refs, str) or not isinstance(refs, list):
                    raise _input_error(f"{REFERENCE_IMAGES}: expected a list")
                out.values[f"{name}:{form}"] = [
                    await self._value(ref, f"{name}[{i}]", form, out) for i, ref in enumerate(refs)
                ]
            else:
                out.values[f"{name}:{form}"] = await self._value(refs, name, form, out)
        part = self._api.references.multipart_field
        if part:
            if self._params.get(REFERENCE_IMAGES):
                raise _input_error(
                    f"{REFERENCE_IMAGES}: this model takes one image, as {REFERENCE_IMAGE}"
                )
            ref = self._params.get(REFERENCE_IMAGE)
            if ref is not None:
                image = await self._image(ref, REFERENCE_IMAGE)
                out.files[part] = (image.filename, image.data, image.mime)
        return out

    async def send(
        self,
        submit: Callable[[SubmitImages, bool], Awaitable[Answer]],
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> Answer:
        """`submit` with this attempt's images; if the vendor no longer knows
        an uploaded id (404/410), the images are uploaded again once and the
        submit sent again (flagged, for its own Idempotency-Key), never in a loop."""
        images = await self.build()
        try:
            return await submit(images, False)
        except CallFailed as exc:
            if exc.failure.status not in (404, 410) or not images.uploaded:
                raise
            log.info(
                "the provider refused an uploaded reference image (HTTP %s); uploading it again",
                exc.failure.status,
            )
            self.forget(images)
            return await submit(await self.build(), True)

    def _has_images(self) -> bool:
        return any(self._params.get(name) for name in IMAGE_PARAMS)

    def forget(self, images: SubmitImages) -> None:
        """The vendor refused these uploads' ids: the next build uploads again."""
        for image, value in images.uploaded:
            self._uploads.forget(self._endpoint, image, value)


async def upload_image(
    api: ApiSpec,
    params: Mapping[str, Any],
    make_call: Callable[[str, str], Call],
    retrying: Callable[..., Awaitable[Answer]],
    log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    image: Prepared,
) -> Any:
    """One reference image to ``[api.upload]``; the id (or URL) its answer gives.

    Sent like every request (the allowlist, the provider's gate and quota,
    in-place retries: a repeated upload at worst leaves the vendor an unused
    copy, never a second job)."""
    spec = api.upload
    assert spec is not None  # `image_needs` refuses "upload" without it
    url = join_url(api.base_url, format_path(spec.path, params))
    files = {spec.field: (image.filename, image.data, image.mime)}
    call = replace(make_call(spec.method.upper(), url), files=files, form=dict(spec.form))
    # Not cancelable: other tasks may be waiting for this very upload.
    answer = await retrying(call, cancelable=False)
    value = lookup(answer.data, spec.id)
    if not isinstance(value, str | int) or isinstance(value, bool) or value == "":
        raise CallFailed(
            bad_answer(f"the upload answer has no file id at {spec.id!r}", retryable=False)
        )
    log.info("uploaded reference image %s: %s", image.sha256[:12], value)
    return value


async def fetch_image(
    make_call: Callable[[str, str], Call],
    download: Callable[[Call, Path], Awaitable[ResultFile]],
    url: str,
) -> bytes:
    """The bytes at an http(s) reference URL, via a throwaway file (downloads
    stream to disk, hashed and capped, like every result)."""
    with tempfile.TemporaryDirectory(prefix="dispatcher-ref-") as folder:
        saved = await download(make_call("GET", url), Path(folder))
        return await asyncio.to_thread(Path(saved.path).read_bytes)
