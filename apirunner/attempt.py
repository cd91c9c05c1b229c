"""One API attempt: the requests of a chat or an async job, from a profile.

`ProviderAttempt` lives for one `ApiRunner.run`: it renders and sends the
submit, records the remote id, polls on the schedule, reads or downloads
the result, and cancels the remote job when asked (see `apirunner.runner`
for the failure rules it follows).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from apirunner.classify import Failure, bad_answer, classify_remote_failure
from apirunner.client import (
    Answer,
    AttemptBase,
    AttemptScope,
    Call,
    CallFailed,
    with_retries,
)
from apirunner.inline import save_inline
from apirunner.polling import PollEvidence, ProgressTrack, next_poll_wait
from apirunner.refsend import ReferenceSender, SubmitImages, fetch_image, upload_image
from apirunner.remote import (
    RemoteIdRefused,
    RemoteRef,
    RemoteStatus,
    interpret_status,
    ref_from_submit,
)
from apirunner.templates import (
    MISSING,
    TemplateError,
    format_path,
    is_url,
    join_url,
    lookup,
    render_body,
    split_path,
    walk,
    with_query,
)
from dispatcher.allowlist import origin_of
from dispatcher.errors import (
    PermanentError,
    RunError,
    TaskCanceled,
    TransientError,
)
from dispatcher.models import Stage
from dispatcher.pricing import reported_cost_usd
from dispatcher.refimages import PreparedImages, UploadCache
from dispatcher.scheduling.protocol import ResultFile, RunResult
from dispatcher.settings import Settings
from dispatcher.tasks.fingerprint import LocalFiles

log = logging.getLogger("apirunner")

# Consecutive failed polls (5xx, dropped connections) before the attempt gives
# up; rate limits do not count, a provider saying "later" is healthy.
MAX_POLL_ERRORS = 10
# A result path may cross at most this many provider-returned URLs.
MAX_URL_HOPS = 3
# Canceling is a courtesy to the provider (it frees quota); it must not hold
# the lane for long when the provider is slow or rate-limits us.
CANCEL_BUDGET_S = 10.0


def config_error(message: str) -> PermanentError:
    return PermanentError(message, kind="config")


class ProviderAttempt(AttemptBase):
    """One attempt of one task; lives for the duration of `ApiRunner.run`."""

    def __init__(
        self,
        scope: AttemptScope,
        *,
        settings: Settings,
        prepared_images: PreparedImages,
        uploads: UploadCache,
    ) -> None:
        super().__init__(scope)
        api, ctx, task = scope.api, scope.ctx, scope.task
        self.max_download_bytes = api.max_download_bytes or settings.max_download_bytes
        # Every request, hops and body included, ends within the profile's timeout.
        self.deadline_s = self.clock.scaled(api.timeout_s)
        self.deadline_label = f"the profile's timeout_s ({api.timeout_s:g} s)"
        self.params: dict[str, Any] = dict(task.params)
        self.polls = 0
        self.http_version = ""
        self.last_answer: Any = None  # the provider's, kept as evidence if the attempt fails
        self.refs = ReferenceSender(
            api,
            self.params,
            LocalFiles.under(settings.resolved_input_dirs, settings.max_reference_image_bytes),
            prepared_images,
            uploads,
            partial(upload_image, api, self.params, self.call, self.retrying, ctx.log),
            partial(ctx.set_stage, Stage.UPLOADING),
            partial(fetch_image, self.call, self._download_reference),
        )
        self.max_reference_bytes = settings.max_reference_image_bytes

    # -- shared helpers ------------------------------------------------------
    def call(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        idempotency_key: str | None = None,
        read_timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Call:
        sent = {"Accept": "application/json"}
        if idempotency_key:
            sent["Idempotency-Key"] = idempotency_key
        # The key goes only to the profile's own host, on every hop: never to
        # a URL the provider handed back that points elsewhere (a CDN, another
        # tenant), nor across a redirect that leaves the host. The profile's
        # fixed headers go the same way: they are the vendor's business only.
        own = origin_of(self.api.base_url)
        creds = self.client.keys.credentials(self.api, self.clock.now())
        credentials = {**self.api.headers, **(headers or {}), **creds.headers}
        if creds.query and origin_of(url) == own:
            url = with_query(url, creds.query)
        return Call(
            method,
            url,
            sent,
            body,
            read_timeout_s,
            credentials=credentials,
            credentials_origin=own,
            deadline_s=self.deadline_s,
            deadline_label=self.deadline_label,
            errors=self.api.errors,
            rate_limit=self.api.rate_limit,
        )

    def url_for(
        self, path: str | None, url_path: str | None, ref: RemoteRef | None, what: str
    ) -> str:
        if url_path:
            if ref is None or ref.submit is None:
                raise config_error(f"{what}: url = {url_path!r} needs a stored submit answer")
            found = lookup(ref.submit, url_path)
            if not is_url(found):
                raise CallFailed(
                    bad_answer(
                        f"submit answer has no URL at {url_path!r} for {what}", retryable=False
                    )
                )
            return str(found)
        if path is None:
            raise config_error(f"{what} needs `path` or `url` in the profile")
        values = dict(self.params)
        if ref is not None:
            values["id"] = ref.id
        return join_url(self.api.base_url, format_path(path, values))

    async def retrying(self, call: Call, *, cancelable: bool = True) -> Answer:
        # A 2xx we cannot read is never sent again (`decide_retry`): for a
        # submit the job exists, and even the same Idempotency-Key would ask
        # the provider for another.
        sent = with_retries(
            partial(self.client.json, call),
            clock=self.clock,
            rand=self.rand,
            on_retry=self._log_retry,
        )
        answer = await (self.ctx.guard(sent) if cancelable else sent)
        self.http_version = answer.http_version
        self.last_answer = answer.data
        return answer

    async def _download_reference(self, call: Call, folder: Path) -> ResultFile:
        download = partial(
            self.client.download, call, folder, "ref", max_bytes=self.max_reference_bytes
        )
        return await self.ctx.guard(
            with_retries(download, clock=self.clock, rand=self.rand, on_retry=self._log_retry)
        )

    def _log_retry(self, failure: Failure, tries: int) -> None:
        self.ctx.log.info("retrying in place (%d): %s [%s]", tries, failure.message, failure.kind)

    async def resolve(self, docs: list[Any], path: str, what: str) -> Any:
        """The value at a dotted path, fetching provider URLs the path crosses."""
        segments = split_path(path)
        for doc in docs:
            found = walk(doc, segments)
            if found.value is MISSING:
                continue
            hops = 0
            while found.rest:
                hops += 1
                if hops > MAX_URL_HOPS:
                    raise CallFailed(
                        bad_answer(f"{what}: too many URLs on {path!r}", retryable=False)
                    )
                url = str(found.value)
                answer = await self.retrying(self.call("GET", url))
                found = walk(answer.data, found.rest)
                if found.value is MISSING:
                    raise CallFailed(
                        bad_answer(f"{what}: the answer of {url} has no {path!r}", retryable=False)
                    )
            return found.value
        raise CallFailed(
            bad_answer(f"{what}: the provider's answer has no {path!r}", retryable=False)
        )

    def meta(
        self, ref: RemoteRef | None = None, status: RemoteStatus | None = None
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "provider": self.client.provider,
            "http_version": self.http_version,
        }
        if ref is not None:
            meta["remote_id"] = ref.id
            meta["polls"] = self.polls
        if status is not None:
            meta["remote_state"] = status.raw_state
        # The vendor's own account of the cost beats the price table (issue 30).
        reported = reported_cost_usd(self.ctx.profile.pricing, self.last_answer)
        if reported is not None:
            meta["cost_usd"] = reported
        return meta

    def submit_call(
        self, images: SubmitImages, read_timeout_s: float | None = None, *, again: bool = False
    ) -> Call:
        submit = self.api.submit
        if submit.url:
            raise config_error("[api.submit] takes a `path`; `url` is only for later calls")
        url = join_url(self.api.base_url, format_path(submit.path or "", self.params))
        values = {**self.params, **images.values}
        body = render_body(submit.body, values) if submit.body is not None else None
        # A submit sent again after its images were uploaded again is a new
        # request (the first one made no job): a key of its own, so a vendor
        # that replays answers by key does not replay the refusal.
        key = f"{self.task.id}-{self.task.attempt}" + ("-reupload" if again else "")
        call = self.call(
            submit.method.upper(),
            url,
            body,
            idempotency_key=key,
            read_timeout_s=read_timeout_s,
            headers=submit.headers,
        )
        if not images.files:
            return call  # a multipart profile's task without an image: plain JSON
        form = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (body or {}).items()}
        return replace(call, json=None, files=images.files, form=form)

    async def send_submit(
        self, read_timeout_s: float | None = None, *, cancelable: bool = True
    ) -> Answer:
        """The submit, with its reference images (see `ReferenceSender.send`)."""

        async def send(images: SubmitImages, again: bool) -> Answer:
            call = self.submit_call(images, read_timeout_s, again=again)
            return await self.retrying(call, cancelable=cancelable)

        return await self.refs.send(send, self.ctx.log)

    # -- chat ------------------------------------------------------------------
    async def chat(self) -> RunResult:
        result = self.api.result
        assert result is not None and (result.text or result.base64)  # the profile validator
        # The answer *is* the generation: the read timeout is the model's
        # generation timeout, never shorter than a plain HTTP read.
        read_s = max(self.http_timeout_s, self.clock.scaled(self.api.timeout_s))
        await self.ctx.set_stage(Stage.GENERATING)
        answer = await self.send_submit(read_s)
        if result.base64:  # an image API answering the file inline
            return RunResult(
                files=[await self.inline_file([answer.data], result.base64)], meta=self.meta()
            )
        assert result.text is not None
        value = await self.resolve([answer.data], result.text, "chat answer")
        return RunResult(
            text=value if isinstance(value, str) else json.dumps(value), meta=self.meta()
        )

    async def inline_file(self, docs: list[Any], path: str) -> ResultFile:
        found = await self.resolve(docs, path, "[api.result] base64")
        if not isinstance(found, str):
            raise CallFailed(
                bad_answer(f"[api.result] base64 {path!r} is not a string", retryable=False)
            )
        return await save_inline(found, self.ctx.result_dir, self.task.id, self.max_download_bytes)

    async def extra_fetch(self, ref: RemoteRef, status_data: Any) -> Any:
        """`[api.result] fetch`: one more call (a file id -> its download URL)."""
        spec = self.api.result
        assert spec is not None and spec.fetch is not None
        values: dict[str, Any] = {**self.params, "id": ref.id}
        for name, path in spec.fetch_values.items():
            found = lookup(status_data, path)
            if found is MISSING or found is None or isinstance(found, dict | list):
                raise CallFailed(
                    bad_answer(
                        f"[api.result] fetch_values: no {path!r} in the answer", retryable=False
                    )
                )
            values[name] = found
        url = join_url(self.api.base_url, format_path(spec.fetch, values))
        answer = await self.retrying(self.call("GET", url))
        return answer.data

    # -- async jobs --------------------------------------------------------------
    async def job(self) -> RunResult:
        ref = RemoteRef.decode(self.task.remote_id) if self.task.remote_id else None
        resumed = ref is not None
        if ref is None:
            ref = await self.submit()
            await self.ctx.set_remote_id(ref.encode())
            # One per attempt, on the dispatch path; the remote id is kept on the
            # task (`dispatcher status`), so INFO would only repeat it.
            self.ctx.log.debug("submitted: remote id %s", ref.id)
        else:
            self.ctx.log.info("resuming remote job %s without resubmitting", ref.id)
        finished = False
        try:
            self.ctx.check_canceled()
            status, status_data = await self.poll(ref, first_wait=not resumed)
            finished = True
            if status.state == "failed":
                raise classify_remote_failure(status.error, self.api.errors).to_error()
            if status.state == "canceled":
                self.ctx.check_canceled()
                raise PermanentError(
                    "the provider reports the job canceled", kind="remote_canceled"
                )
            return await self.fetch_result(ref, status, status_data)
        except (TaskCanceled, RunError, CallFailed):
            # Abandoning a job that still runs: cancel it so it stops holding
            # quota. Not on CancelledError: that is a shutdown, and restart
            # recovery will resume this very job.
            if not finished:
                await self.cancel_remote(ref)
            raise

    async def submit(self) -> RemoteRef:
        # Wait out a closed gate while nothing has been sent, so a cancel
        # still stops us cleanly; the submit itself is never cut in half,
        # since a job created behind a torn-down request could not be named.
        await self.ctx.guard(self.client.gate.wait())
        answer = await self.send_submit(cancelable=False)
        try:
            ref = ref_from_submit(self.api, answer.data)
        except RemoteIdRefused as exc:
            raise CallFailed(bad_answer(str(exc), retryable=False)) from exc
        if ref is None:
            where = self.api.submit.id or "(status url)"
            raise CallFailed(
                bad_answer(f"the submit answer has no job id at {where!r}", retryable=False)
            )
        return ref

    async def poll(self, ref: RemoteRef, *, first_wait: bool) -> tuple[RemoteStatus, Any]:
        spec = self.api.status
        assert spec is not None  # the profile validator requires it for async jobs
        url = self.url_for(spec.path, spec.url, ref, "[api.status]")
        call = self.call("GET", url)
        deadline = self.clock.monotonic() + self.clock.scaled(self.api.timeout_s)
        step = 0
        errors = 0
        wait = first_wait
        last = "submitted"
        # A resumed job was submitted when its task started, not now.
        submitted = self.clock.now() if first_wait else self.task.started_at or self.clock.now()
        progress, position = ProgressTrack(), None
        while True:
            if wait:
                elapsed_s = (self.clock.now() - submitted) / self.clock.time_scale
                evidence = PollEvidence(step, elapsed_s, self.ctx.history_s, progress, position)
                await self.ctx.guard(self.clock.sleep(next_poll_wait(evidence, self.rand)))
                step += 1
            wait = True
            self.ctx.check_canceled()
            if self.clock.monotonic() >= deadline:
                raise TransientError(
                    f"remote job {ref.id} still {last} after {self.api.timeout_s:g} s",
                    kind="timeout",
                )
            try:
                answer = await self.ctx.guard(self.client.json(call))
            except CallFailed as exc:
                failure = exc.failure
                if not failure.retryable:
                    raise
                if not failure.rate_limited:
                    errors += 1
                    if errors >= MAX_POLL_ERRORS:
                        raise
                    # An answer we cannot read is a failed poll, retried like
                    # a 5xx; it never brings the submit back (see `run`).
                # With a Retry-After the gate already holds the next poll back
                # exactly as long as asked; adding the schedule would overshoot.
                wait = failure.retry_after_s is None
                self.ctx.log.debug("poll failed, polling on: %s", failure.message)
                continue
            errors = 0
            self.polls += 1
            self.http_version = answer.http_version
            self.last_answer = answer.data
            status = interpret_status(spec, answer.data)
            last = status.raw_state or last
            elapsed_s = (self.clock.now() - submitted) / self.clock.time_scale
            progress, position = progress.observe(elapsed_s, status.progress), status.queue_position
            await self.ctx.set_stage(Stage.GENERATING, status.progress, status.queue_position)
            if status.terminal:
                return status, answer.data

    async def fetch_result(
        self, ref: RemoteRef, status: RemoteStatus, status_data: Any
    ) -> RunResult:
        spec = self.api.result
        if spec is None:
            return RunResult(meta={**self.meta(ref, status), "status": status_data})
        docs = [status_data, ref.submit or {}]
        if spec.fetch:
            docs.insert(0, await self.extra_fetch(ref, status_data))
        if spec.text:
            value = await self.resolve(docs, spec.text, "[api.result] text")
            text = value if isinstance(value, str) else json.dumps(value)
            return RunResult(text=text, meta=self.meta(ref, status))
        await self.ctx.set_stage(Stage.DOWNLOADING)
        if spec.base64:
            inline = await self.inline_file(docs, spec.base64)
            return RunResult(files=[inline], meta=self.meta(ref, status))
        if spec.url:
            found = await self.resolve(docs, spec.url, "[api.result] url")
            if not is_url(found):
                raise CallFailed(
                    bad_answer(
                        f"[api.result] url {spec.url!r} is not a URL: {found!r}", retryable=False
                    )
                )
            url = str(found)
        else:
            url = self.url_for(spec.path, None, ref, "[api.result]")
        call = self.call("GET", url)
        stem = f"{self.task.id}"
        download = partial(
            self.client.download, call, self.ctx.result_dir, stem, max_bytes=self.max_download_bytes
        )
        result_file = await self.ctx.guard(
            with_retries(download, clock=self.clock, rand=self.rand, on_retry=self._log_retry)
        )
        return RunResult(files=[result_file], meta=self.meta(ref, status))

    async def cancel_remote(self, ref: RemoteRef) -> None:
        spec = self.api.cancel
        if spec is None:
            return
        try:
            url = self.url_for(spec.path, spec.url, ref, "[api.cancel]")
            body = render_body(spec.body, self.params) if spec.body is not None else None
            call = self.call(spec.method.upper(), url, body, headers=spec.headers)
            # Not guarded: we are the ones canceling.
            await asyncio.wait_for(self.client.json(call), timeout=CANCEL_BUDGET_S)
            self.ctx.log.info("remote job %s canceled at the provider", ref.id)
        except (CallFailed, RunError, TemplateError, TimeoutError) as exc:
            self.ctx.log.warning("could not cancel remote job %s: %s", ref.id, exc)
