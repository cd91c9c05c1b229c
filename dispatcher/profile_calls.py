"""The `[api]` tables that describe a vendor's calls: the submit and cancel
calls (`HttpCall`), how a job's status and result are read (`StatusSpec`,
`ResultSpec`), and how reference images travel (`UploadSpec`,
`ReferenceSpec`, the image forms a submit body may name).

Kept apart from `dispatcher.profiles` (which embeds them in `[api]`) so that
module stays about a profile's shape and loading; like
`dispatcher.profile_extras`, nothing here names a vendor.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HttpCall(_Strict):
    method: str = "GET"
    path: str | None = None  # appended to base_url, may contain {id} and {param}
    url: str | None = None  # dotted path into the submit answer holding a full URL
    body: dict[str, Any] | None = None
    id: str | None = None  # dotted path of the remote id in the answer
    # The id is the value's last "/" segment (an operation name
    # "models/m/operations/abc" gives "abc"), for a `path` with "{id}".
    id_last_segment: bool = False
    headers: dict[str, str] = Field(default_factory=dict)  # sent with this call only


class StatusSpec(_Strict):
    path: str | None = None
    url: str | None = None
    state: str = "status"
    progress: str | None = None
    queue_position: str | None = None
    error: str | None = None
    # Dotted paths (one, or a list) whose presence (not null, not empty) means
    # the job failed even when `state` says finished (an operation with
    # `done: true` and an `error` object); the value's text is the reason.
    failed_if: tuple[str, ...] = ()
    map: dict[str, Literal["pending", "running", "success", "failed", "canceled"]] = Field(
        default_factory=dict
    )

    @field_validator("failed_if", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value


class ResultSpec(_Strict):
    path: str | None = None  # download this (relative to base_url)
    url: str | None = None  # a URL found at this dotted path (status or submit answer)
    text: str | None = None  # text found at this dotted path
    base64: str | None = None  # a file sent inline as base64 at this dotted path
    # One more call before the result: GET this path (relative to base_url,
    # "{id}", task parameters and the `fetch_values` below as placeholders);
    # `url`/`text`/`base64` are then read in its answer first.
    fetch: str | None = None
    fetch_values: dict[str, str] = Field(default_factory=dict)  # placeholder -> dotted path

    @model_validator(mode="after")
    def _fetch_values_need_fetch(self) -> ResultSpec:
        if self.fetch_values and not self.fetch:
            raise ValueError("`fetch_values` needs `fetch` (the path of the extra call)")
        return self


# -- reference images (issue 15): how a vendor wants them -------------------
class UploadSpec(_Strict):
    """Upload first: each reference image goes to this endpoint once, and the
    id (or URL) its answer gives replaces ``{reference_image:upload}``."""

    method: str = "POST"
    path: str  # appended to base_url
    field: str = "file"  # the multipart file part's name
    form: dict[str, str] = Field(default_factory=dict)  # plain fields sent along
    id: str = "id"  # dotted path of the file's id or URL in the answer


class ReferenceSpec(_Strict):
    """How reference images are prepared and sent (``[api.references]``).

    Preparation (each optional) is done once per image and cached: scale the
    long edge down to `max_edge_px`, re-encode as `format`, and shrink until
    the encoded image is at most `max_bytes`. `multipart_field` makes the
    submit ``multipart/form-data`` with the image as that file part (the
    body template's other values become form fields). `upload_ttl_s`: how
    long an uploaded image's id is reused before it is uploaded again."""

    max_edge_px: int | None = Field(default=None, ge=16)
    format: Literal["png", "jpeg", "webp"] | None = None
    max_bytes: int | None = Field(default=None, ge=1024)
    multipart_field: str | None = None
    upload_ttl_s: float = Field(default=3600.0, gt=0)


_IMAGE_FORM = re.compile(r"\{(reference_images?):([A-Za-z_][A-Za-z0-9_]*)\}")
IMAGE_FORMS = ("data_url", "base64", "url", "upload")


def check_image_forms(body: Any, has_upload: bool) -> None:
    """Image placeholders in a submit body name a known form, and
    ``:upload`` has an [api.upload] to come from (refused at load, not per task)."""
    for text in _strings(body):
        for match in _IMAGE_FORM.finditer(text):
            name, form = match.groups()
            if form not in IMAGE_FORMS:
                raise ValueError(
                    f"{{{name}:{form}}}: unknown form; use one of {', '.join(IMAGE_FORMS)}"
                )
            if form == "upload" and not has_upload:
                raise ValueError(f"{{{name}:upload}} needs an [api.upload] table")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []
