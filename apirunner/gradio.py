"""A gradio app as an API style (``style = "gradio"``): its own HTTP API, not its page.

One attempt (`run_gradio`):

1. ``GET /gradio_api/info``: the endpoint's parameters. The task's params go
   in by parameter name (the profile's `inputs`), with the profile's fixed
   `values`, and each parameter's default for the rest.
2. Reference images (``images = { reference_image = "image" }``) are posted
   to ``/gradio_api/upload`` once per provider (the upload cache) and sent
   as the file object gradio expects.
3. ``POST /gradio_api/call/<api_name>`` with the positional ``data``; the
   ``event_id`` it answers is stored as the remote id before anything else.
4. Follow the event on ``GET /gradio_api/queue/data?session_hash=<event_id>``
   (a ``/call`` event is its own session). That stream carries what the
   ``/call/<api_name>/<event_id>`` stream drops: ``estimation`` (rank in the
   app's queue and its ETA: the task's queue position and ETA),
   ``process_starts`` and ``progress`` (the task's progress), then
   ``process_completed``.
5. Download every output file through the one fetch path (allowlisted,
   streamed, capped); text outputs are the task's text.

Cancel posts ``/gradio_api/cancel`` (the event leaves the app's queue, or its
running function is cancelled). A restart resumes the stored event when the
app still holds it; gradio forgets an event once the stream that followed it
closes, so a restart mid-run ends that attempt with a ``remote_lost`` error
and the next attempt submits again (docs/gradio.md, measured).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from functools import partial
from typing import Any
from urllib.parse import quote, urlencode

from apirunner.classify import decide_retry
from apirunner.client import (
    AttemptBase,
    AttemptScope,
    Call,
    CallFailed,
    profile_call,
    with_retries,
)
from apirunner.gradio_events import (
    GradioEvent,
    OutputFile,
    SseLines,
    StreamTooLong,
    build_data,
    endpoint_parameters,
    file_value,
    fn_index,
    output_items,
    read_event,
    uploaded_path,
)
from apirunner.templates import join_url
from dispatcher.allowlist import same_origin
from dispatcher.errors import DispatcherError, InputError, PermanentError, TransientError
from dispatcher.models import Stage
from dispatcher.refimages import PreparedImages, UploadCache
from dispatcher.scheduling.protocol import ResultFile, RunResult
from dispatcher.tasks.fingerprint import LocalFiles

PREFIX = "/gradio_api"
# gradio sends a heartbeat every 15 s on a quiet stream: four missed is a dead app.
STREAM_READ_TIMEOUT_S = 60.0
# Values (numbers, labels) of a result kept in its meta, as JSON characters.
MAX_VALUES_CHARS = 10_000


async def run_gradio(
    scope: AttemptScope,
    *,
    prepared_images: PreparedImages,
    uploads: UploadCache,
    reference_files: LocalFiles,
    max_download_bytes: int,
) -> RunResult:
    attempt = _GradioAttempt(scope, prepared_images, uploads, reference_files)
    attempt.max_download_bytes = max_download_bytes
    try:
        return await attempt.run()
    except InputError as exc:
        # A mapping the app does not take, a reference image gone since.
        raise PermanentError(str(exc), kind="input") from exc


class _GradioAttempt(AttemptBase):
    def __init__(
        self,
        scope: AttemptScope,
        prepared_images: PreparedImages,
        uploads: UploadCache,
        reference_files: LocalFiles,
    ) -> None:
        super().__init__(scope)
        self.prepared_images = prepared_images
        self.uploads = uploads
        self.reference_files = reference_files
        self.max_download_bytes = 0
        self.ended = False  # the app said the event is over (done, failed, gone)
        assert self.api.api_name is not None  # the profile's validator saw to it
        self.api_name: str = self.api.api_name

    # -- plumbing ----------------------------------------------------------------
    def url(self, path: str, query: dict[str, str] | None = None) -> str:
        url = join_url(self.api.base_url, path)
        return f"{url}?{urlencode(query)}" if query else url

    def make_call(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        files: dict[str, tuple[str, bytes, str]] | None = None,
        read_timeout_s: float | None = None,
        deadline: bool = True,
    ) -> Call:
        """A request through the one fetch path; the token (a private app's)
        goes only to the profile's own origin, never across a redirect."""
        return profile_call(
            self.api,
            self.clock,
            method,
            url,
            body,
            files=files,
            read_timeout_s=read_timeout_s,
            deadline=deadline,
        )

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """A request that changes nothing twice (reads, cancel): retried in place."""
        call = self.make_call(method, self.url(path), body)
        answer = await self.ctx.guard(
            with_retries(partial(self.client.json, call), clock=self.clock, rand=self.rand)
        )
        return answer.data

    # -- the attempt -------------------------------------------------------------
    async def run(self) -> RunResult:
        event_id = self.task.remote_id
        if event_id:
            self.ctx.log.info("resuming gradio event %s without calling the app again", event_id)
        else:
            info = await self.request("GET", f"{PREFIX}/info")
            parameters = endpoint_parameters(info, self.api_name)
            files = await self.upload_images()
            data = build_data(
                parameters,
                self.api_name,
                inputs=self.api.inputs,
                values=self.api.values,
                images=list(self.api.images.values()),
                params=self.task.params,
                files=files,
            )
            await self.ctx.guard(self.client.gate.wait())
            event_id = await self.submit(data)
        try:
            done = await self.ctx.guard(
                self.follow(event_id),
                self.clock.scaled(self.api.timeout_s),
                what=f"waiting for gradio event {event_id}",
                budget_label=f"the profile's timeout_s ({self.api.timeout_s:g} s)",
            )
            return await self.collect(event_id, done)
        except (DispatcherError, CallFailed):
            # Canceled or given up on (a timeout, a stream we cannot read):
            # free the app's queue. Not on CancelledError (a shutdown): the
            # event may yet be resumed.
            if not self.ended:
                await self.cancel_remote(event_id)
            raise

    async def submit(self, data: list[Any]) -> str:
        call = self.make_call("POST", self.url(f"{PREFIX}/call{self.api_name}"), {"data": data})
        errors = rate_limits = 0
        while True:
            try:
                answer = await self.ctx.guard(self.client.json(call))
                break
            except CallFailed as exc:
                failure = exc.failure
                if failure.status in (400, 404, 422):
                    raise PermanentError(
                        f"the gradio app refused the call to {self.api_name} "
                        f"(HTTP {failure.status}): {_detail(exc.body)}",
                        kind="rejected",
                    ) from exc
                # A call is not idempotent: repeat it only when the app cannot
                # have queued it (no connection, queue full, rate limited).
                if not (failure.kind == "connect" or failure.status in (429, 503)):
                    raise
                decision = decide_retry(failure, errors, rate_limits, self.rand)
                if not decision.retry:
                    raise
                rate_limits += decision.rate_limited
                errors += not decision.rate_limited
                await self.ctx.guard(self.clock.sleep(decision.wait_s))
        found = answer.data.get("event_id") if isinstance(answer.data, dict) else None
        if not isinstance(found, str) or not found or len(found) > 200:
            raise PermanentError("the gradio app's call answer has no event_id", kind="bad_answer")
        await self.ctx.set_remote_id(found)
        self.ctx.log.info("submitted: gradio event %s on %s", found, self.api_name)
        return found

    async def upload_images(self) -> dict[str, Any]:
        """Each reference image posted once per provider: parameter -> file object."""
        endpoint = self.url(f"{PREFIX}/upload")
        files: dict[str, Any] = {}
        for param, target in self.api.images.items():
            ref = self.task.params.get(param)
            if ref is None:
                continue
            await self.ctx.set_stage(Stage.UPLOADING)
            image = await self.prepared_images.get(
                ref, param, self.reference_files, self.api.references
            )

            async def upload(data: bytes = image.data, name: str = image.filename) -> Any:
                call = self.make_call(
                    "POST", endpoint, files={"files": (name, data, "application/octet-stream")}
                )
                answer = await with_retries(
                    partial(self.client.json, call), clock=self.clock, rand=self.rand
                )
                try:
                    return uploaded_path(answer.data)
                except ValueError as exc:
                    raise PermanentError(str(exc), kind="bad_answer") from exc

            path, made = await self.ctx.guard(
                self.uploads.get(endpoint, image, self.api.references.upload_ttl_s, upload)
            )
            self.ctx.log.info("%s %s as %s", "uploaded" if made else "reused", param, path)
            files[target] = file_value(path, image.filename)
        return files

    # -- following the event -------------------------------------------------------
    async def follow(self, event_id: str) -> GradioEvent:
        """Read the event's stream until it ends; report rank, ETA and progress."""
        await self.ctx.set_stage(Stage.GENERATING)
        call = self.make_call(
            "GET",
            self.url(f"{PREFIX}/queue/data", {"session_hash": event_id}),
            read_timeout_s=max(self.http_timeout_s, STREAM_READ_TIMEOUT_S),
            deadline=False,
        )
        lines = SseLines()
        async with self.client.stream(call) as response:
            async for chunk in response.aiter_bytes():
                try:
                    payloads = lines.feed(chunk)
                except StreamTooLong as exc:
                    raise PermanentError(
                        f"gradio event {event_id}: {exc}", kind="bad_answer"
                    ) from exc
                for payload in payloads:
                    event = read_event(payload, event_id)
                    if await self.on_event(event_id, event):
                        return event
        raise TransientError(
            f"the gradio app closed the stream of event {event_id} before it finished",
            kind="remote_lost",
        )

    async def on_event(self, event_id: str, event: GradioEvent) -> bool:
        """Report what a message says; True when the event has a result."""
        self.ended = event.kind in ("completed", "failed", "lost")
        if event.kind == "queued":
            self.ctx.set_remote_eta(event.eta_s)
            await self.ctx.set_stage(Stage.GENERATING, None, event.rank)
        elif event.kind == "started":
            self.ctx.set_remote_eta(event.eta_s)
            await self.ctx.set_stage(Stage.GENERATING, 0.0)
        elif event.kind == "progress":
            await self.ctx.set_stage(Stage.GENERATING, event.progress)
        elif event.kind == "generating":
            self.ctx.beat()  # a streaming endpoint's partial output
        elif event.kind == "failed":
            raise PermanentError(
                f"the gradio app failed event {event_id}: {event.message}", kind="app_error"
            )
        elif event.kind == "lost":
            raise TransientError(
                f"the gradio app no longer serves event {event_id} ({event.message}): gradio "
                "forgets an event once the stream that followed it closes (a restart of "
                "this service, a dropped connection); the next attempt calls the app again",
                kind="remote_lost",
            )
        return event.kind == "completed"

    # -- results -------------------------------------------------------------------
    async def collect(self, event_id: str, done: GradioEvent) -> RunResult:
        outputs = output_items(done.output)
        if not (outputs.files or outputs.texts or outputs.values):
            raise PermanentError(
                f"gradio event {event_id} ended without output (cancelled on the app?)",
                kind="no_output",
            )
        self.ctx.set_remote_eta(None)
        results: list[ResultFile] = []
        if outputs.files:
            await self.ctx.set_stage(Stage.DOWNLOADING)
            for number, item in enumerate(outputs.files):
                results.append(await self.download(item, number))
        values = outputs.values if len(json.dumps(outputs.values)) <= MAX_VALUES_CHARS else None
        meta = {
            "provider": self.client.provider,
            "remote_id": event_id,
            "api_name": self.api_name,
            "seed": self.task.params.get("seed"),
            "outputs": [{"index": f.index, "name": f.name, "path": f.path} for f in outputs.files],
            "values": values,
        }
        text = "\n".join(outputs.texts) if outputs.texts else None
        return RunResult(text=text, files=results, meta=meta)

    async def download(self, item: OutputFile, number: int) -> ResultFile:
        # The app's own URL when it names the profile's origin; else built from
        # the path (an app behind a proxy may name a host we do not know).
        if item.url and same_origin(item.url, self.api.base_url):
            url = item.url
        else:
            url = self.url(f"{PREFIX}/file={quote(item.path, safe='/')}")
        download = with_retries(
            partial(
                self.client.download,
                self.make_call("GET", url),
                self.ctx.result_dir,
                f"{self.task.id}-{number}",
                max_bytes=self.max_download_bytes,
            ),
            clock=self.clock,
            rand=self.rand,
        )
        return await self.ctx.guard(download)

    # -- cancel ------------------------------------------------------------------
    async def cancel_remote(self, event_id: str) -> None:
        """Take our event off the app: out of its queue, or its function cancelled.

        Best effort, bounded: a dead app must not hold the lane."""
        budget_s = self.clock.scaled(self.api.timeout_s)
        try:
            async with asyncio.timeout(budget_s):
                config = await self._read(self.url("/config"))
                index = fn_index(config, self.api_name)
                body = {"session_hash": event_id, "event_id": event_id, "fn_index": index or 0}
                call = self.make_call("POST", self.url(f"{PREFIX}/cancel"), body)
                await self.client.json(call)
            self.ctx.log.info("asked the gradio app to cancel event %s", event_id)
        except (CallFailed, TimeoutError) as exc:
            self.ctx.log.warning("cancel of gradio event %s: %s", event_id, exc)

    async def _read(self, url: str) -> Any:
        with contextlib.suppress(CallFailed):
            return (await self.client.json(self.make_call("GET", url))).data
        return None  # no config: the event still leaves the queue


def _detail(body: str | None) -> str:
    """gradio's error detail (``{"detail": ...}``), bounded."""
    if not body:
        return "no detail"
    try:
        data = json.loads(body)
    except ValueError:
        return body[:300]
    detail = data.get("detail") if isinstance(data, dict) else None
    return str(detail if detail is not None else data)[:300]
