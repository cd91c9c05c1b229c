"""The demo provider's reference images: uploads and what submits carry.

- ``POST /v1/files`` (multipart, the image in any file part) answers
  ``{"id": "file_…", "bytes": n}`` (``GET /v1/files/{id}/content`` gives the
  bytes back, a URL to pass as a reference); ids expire after ``upload_ttl_s`` real
  seconds (``POST /__mode {"upload_ttl_s": …}``; ``{"expire_uploads": true}``
  expires every id now), after which a submit naming one gets a 404, as
  vendors do.
- A submit may be ``multipart/form-data`` (fields become the body, a file
  part ``input_reference`` is the image, like the OpenAI videos API) or JSON
  whose ``image_url`` / ``image_urls`` / ``input_reference`` hold a file id,
  a ``data:`` URL or an http(s) URL (taken as given).

The sha256 of every image a job received is kept per job, so tests can check
the exact bytes arrived.
"""

from __future__ import annotations

import base64
import binascii
import email.parser
import email.policy
import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from demo.api_protocol import error_response

MAX_BODY_BYTES = 20 * 1024 * 1024
DEFAULT_UPLOAD_TTL_S = 3600.0
IMAGE_KEYS = ("image_url", "image_urls", "input_reference")


@dataclass
class Uploaded:
    sha256: str
    data: bytes
    expires: float  # time.monotonic()


@dataclass
class Files:
    ttl_s: float = DEFAULT_UPLOAD_TTL_S
    files: dict[str, Uploaded] = field(default_factory=dict)
    uploads: int = 0
    upload_bytes: int = 0

    def apply_mode(self, body: dict[str, Any]) -> None:
        """Take this module's knobs out of a ``/__mode`` body (the rest is faults')."""
        if "upload_ttl_s" in body:
            ttl = float(body.pop("upload_ttl_s"))
            if ttl < 0:
                raise ValueError("upload_ttl_s must be >= 0")
            self.ttl_s = ttl
        if body.pop("expire_uploads", False):
            for item in self.files.values():
                item.expires = 0.0

    def stats(self) -> dict[str, Any]:
        return {"uploads": self.uploads, "upload_bytes": self.upload_bytes}

    async def upload(self, request: Request) -> Response:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return error_response(413, "file too large")
        parts = _multipart(request, raw)
        data = next((p.data for p in parts.values() if p.filename is not None), None)
        if data is None:
            return error_response(400, "send the image as a multipart file part")
        file_id = f"file_{uuid.uuid4().hex}"
        self.files[file_id] = Uploaded(
            hashlib.sha256(data).hexdigest(), data, time.monotonic() + self.ttl_s
        )
        self.uploads += 1
        self.upload_bytes += len(data)
        return JSONResponse({"id": file_id, "object": "file", "bytes": len(data)})

    async def content(self, request: Request) -> Response:
        """``GET /v1/files/{id}/content``: an uploaded file's bytes (a URL to reference)."""
        found = self.files.get(request.path_params["fid"])
        if found is None or time.monotonic() >= found.expires:
            return error_response(404, "no such file", "not_found")
        return Response(found.data, media_type="application/octet-stream")

    def _image(self, value: Any, key: str) -> str | Response:
        """The sha256 of the image `value` names, or an error answer."""
        if not isinstance(value, str) or not value:
            return error_response(400, f"`{key}` must be a file id, a data: URL or a URL")
        if value.startswith("data:"):
            _, sep, payload = value.partition(",")
            try:
                data = base64.b64decode(payload, validate=True) if sep else b""
            except (binascii.Error, ValueError):
                data = b""
            if not data:
                return error_response(400, f"`{key}`: malformed data: URL")
            return hashlib.sha256(data).hexdigest()
        if value.startswith(("http://", "https://")):
            return "url:" + value
        found = self.files.get(value)
        if found is None or time.monotonic() >= found.expires:
            return error_response(404, f"`{key}`: no such file {value!r} (expired?)", "not_found")
        return found.sha256

    async def read_submit(self, request: Request) -> tuple[Any, list[str], Response | None]:
        """The submit's body (JSON or multipart) and the hashes of its images."""
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            raw = await request.body()
            if len(raw) > MAX_BODY_BYTES:
                return None, [], error_response(413, "body too large")
            body: dict[str, Any] = {}
            hashes: list[str] = []
            for name, part in _multipart(request, raw).items():
                if part.filename is not None:
                    if name != "input_reference":
                        return None, [], error_response(400, f"unexpected file part {name!r}")
                    hashes.append(hashlib.sha256(part.data).hexdigest())
                else:
                    body[name] = part.data.decode("utf-8", "replace")
            return body, hashes, None
        try:
            body = await request.json()
        except ValueError:
            return None, [], error_response(400, "the body is not JSON")
        if not isinstance(body, dict):
            return body, [], None
        hashes = []
        for key in IMAGE_KEYS:
            values = body.get(key)
            for value in values if isinstance(values, list) else [values]:
                if value is None:
                    continue
                found = self._image(value, key)
                if isinstance(found, Response):
                    return None, [], found
                hashes.append(found)
        return body, hashes, None


@dataclass(frozen=True)
class _Part:
    data: bytes
    filename: str | None


def _multipart(request: Request, raw: bytes) -> dict[str, _Part]:
    head = f"Content-Type: {request.headers.get('content-type', '')}\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
    parts: dict[str, _Part] = {}
    if not message.is_multipart():
        return parts
    for part in message.iter_parts():
        name = str(part.get_param("name", header="content-disposition") or "")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        parts[name] = _Part(data, part.get_filename())
    return parts
