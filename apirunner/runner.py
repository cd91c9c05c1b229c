"""`ApiRunner`: runs API-model tasks from their profiles alone.

Two shapes (SPEC "API runner"), ComfyUI servers (`apirunner.comfyui`) and
gradio apps (`apirunner.gradio`):

- ``chat``: one request; the answer's text is at ``[api.result] text``.
- ``async-job``: submit (with ``Idempotency-Key: <task id>-<attempt>``),
  record the remote id before anything else, poll on the schedule until the
  job ends, then download the result (streamed, sha256) or read its text.
  A task that arrives with a `remote_id` (restart recovery) skips the submit
  and resumes polling; see `apirunner.remote` for what `remote_id` holds.

Failure handling, once per request kind: submits, result reads and
downloads retry transient failures in place (same Idempotency-Key, so the
provider never makes a second job); polls keep polling through 429s and
5xx; only a remote job that failed, or a request that keeps failing,
ends the attempt. A dotted result path may cross a URL the provider returned
(``response_url.images.0.url``): that URL is fetched and the path continues
inside its JSON answer.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import replace

import httpx

from apirunner.attempt import ProviderAttempt, config_error
from apirunner.client import (
    AttemptScope,
    CallFailed,
    ProviderClient,
    build_http_client,
)
from apirunner.comfyui import run_comfyui
from apirunner.gate import RetryGate, SharedGates
from apirunner.gradio import run_gradio
from apirunner.polling import Rand
from apirunner.templates import (
    TemplateError,
)
from dispatcher.allowlist import Allowlist
from dispatcher.clock import Clock
from dispatcher.errors import (
    ConfigError,
    DispatcherError,
    PermanentError,
    RunError,
    TaskCanceled,
)
from dispatcher.models import Task
from dispatcher.profiles import ApiSpec, Profile
from dispatcher.refimages import PreparedImages, UploadCache
from dispatcher.scheduling.protocol import RunContext, Runner, RunnerStats, RunResult
from dispatcher.settings import Settings
from dispatcher.tasks.artifacts import keep_answer
from dispatcher.tasks.fingerprint import LocalFiles

log = logging.getLogger("apirunner")


class ApiRunner(Runner):
    """Runs `kind = "api"` tasks; one pooled client per provider."""

    # A live coroutine is proof of life: nothing here can freeze like a page.
    beats_required = False

    def __init__(
        self,
        settings: Settings,
        profiles: Mapping[str, Profile],
        clock: Clock,
        concurrency: Mapping[str, int],
        *,
        rand: Rand | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        shared_gates: SharedGates | None = None,
    ) -> None:
        self._settings = settings
        self._shared_gates = shared_gates  # several hosts: Retry-After told to all
        self._transport = transport  # None: the network (tests pass a MockTransport)
        self._profiles = {name: p for name, p in profiles.items() if p.api is not None}
        self._clock = clock
        self._concurrency = dict(concurrency)
        self._rand: Rand = rand or random.Random().random
        self.allowlist = Allowlist.from_profiles(self._profiles)
        self._clients: dict[str, ProviderClient] = {}
        # Reference images: prepared once for every profile, uploaded once per provider.
        self.prepared_images = PreparedImages()
        self.uploads: dict[str, UploadCache] = {}

    @property
    def providers(self) -> list[str]:
        return sorted({name for p in self._profiles.values() for name in p.provider_names})

    def stats(self) -> RunnerStats:
        """Counters the service's metrics read: requests by provider and status."""
        return RunnerStats(
            remote_requests={
                (provider, status): count
                for provider, client in self._clients.items()
                for status, count in client.requests.items()
            }
        )

    def effective_concurrency(self, provider: str, quota: int) -> int:
        """The provider's lane concurrency after 429 storms (`health.after_call`)."""
        client = self._clients.get(provider)
        return quota if client is None else min(quota, client.throttle.effective)

    def client(self, provider: str) -> ProviderClient:
        try:
            return self._clients[provider]
        except KeyError:
            raise config_error(
                f"API provider {provider!r} has no client: its profile was not loaded at start"
            ) from None

    async def start(self) -> None:
        # One TLS context for every provider: loading the CA bundle is the
        # slow part of creating a client, and its contents are the same.
        ssl_context = httpx.create_ssl_context()
        for provider in self.providers:
            if provider in self._clients:
                continue
            limit = self._concurrency.get(provider)
            if limit is None:
                limit = self._settings.provider_concurrency(provider)
            if limit < 1:
                raise ConfigError(f"concurrency for API provider {provider!r} must be >= 1")
            gate = RetryGate(self._clock, self._shared_gates, provider)
            http = build_http_client(
                limit,
                self._settings.http_timeout_s,
                self.allowlist,
                ssl_context,
                gate,
                self._transport,
            )
            self.uploads[provider] = UploadCache(self._clock)
            self._clients[provider] = ProviderClient(
                provider,
                http,
                self.allowlist,
                gate,
                self._clock,
                log,
                max_json_bytes=self._settings.max_json_bytes,
                quota=limit,
            )

    def pool_size(self, provider: str) -> int | None:
        """The connection pool a provider's client was opened with (its concurrency then)."""
        if provider not in self._clients:
            return None
        return self._concurrency.get(provider) or self._settings.provider_concurrency(provider)

    async def add_profiles(
        self, profiles: Mapping[str, Profile], concurrency: Mapping[str, int]
    ) -> None:
        """Serve more API profiles while running (a reload): a client per new provider.

        Their hosts must already be on the allowlist (the caller checks):
        the clients hold it, and it does not change while they live.
        """
        self._profiles.update({n: p for n, p in profiles.items() if p.api is not None})
        # An open client keeps the pool it was made with.
        self._concurrency.update({p: n for p, n in concurrency.items() if p not in self._clients})
        await self.start()

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()

    async def run(self, task: Task, ctx: RunContext) -> RunResult:
        profile = ctx.profile
        if profile.api is None:
            raise config_error(f"model {profile.name!r} is not an API model")
        ctx.check_canceled()
        # The lane's provider: its base URL, its key, its pooled client. A
        # resumed task's lane is the provider that accepted its remote id.
        try:
            api = profile.api_for(ctx.owner)
        except ConfigError as exc:
            raise config_error(str(exc)) from None
        client = self.client(ctx.owner)
        attempt = ProviderAttempt(
            self._scope(task, ctx, api, client),
            settings=self._settings,
            prepared_images=self.prepared_images,
            uploads=self.uploads.setdefault(client.provider, UploadCache(self._clock)),
        )
        try:
            return await self._attempt(task, ctx, attempt, api)
        except (RunError, TaskCanceled):
            # What the provider said last is what a person wants to read.
            retention = self._settings.artifacts_retention
            await asyncio.to_thread(keep_answer, ctx.result_dir, attempt.last_answer, retention)
            raise

    def _scope(
        self, task: Task, ctx: RunContext, api: ApiSpec, client: ProviderClient
    ) -> AttemptScope:
        return AttemptScope(
            task=task,
            ctx=ctx,
            api=api,
            client=client,
            clock=self._clock,
            rand=self._rand,
            http_timeout_s=self._settings.http_timeout_s,
        )

    async def _attempt(
        self, task: Task, ctx: RunContext, attempt: ProviderAttempt, api: ApiSpec
    ) -> RunResult:
        try:
            if api.style == "comfyui":
                return await run_comfyui(
                    attempt.scope,
                    allowlist=self.allowlist,
                    max_download_bytes=api.max_download_bytes or self._settings.max_download_bytes,
                    reference_files=LocalFiles.under(
                        self._settings.resolved_input_dirs,
                        self._settings.max_reference_image_bytes,
                    ),
                )
            if api.style == "gradio":
                return await run_gradio(
                    attempt.scope,
                    prepared_images=self.prepared_images,
                    uploads=self.uploads.setdefault(
                        attempt.scope.client.provider, UploadCache(self._clock)
                    ),
                    reference_files=LocalFiles.under(
                        self._settings.resolved_input_dirs,
                        self._settings.max_reference_image_bytes,
                    ),
                    max_download_bytes=api.max_download_bytes or self._settings.max_download_bytes,
                )
            if api.style == "chat":
                return await attempt.chat()
            return await attempt.job()
        except CallFailed as exc:
            if exc.body is not None:
                attempt.last_answer = exc.body
            failure = exc.failure
            if failure.kind == "bad_answer":
                # Only a 2xx answer is ever "bad", and a 2xx means the submit
                # was made: not understanding what came after it is no reason
                # to submit again (another paid generation).
                failure = replace(failure, retryable=False)
            raise failure.to_error() from exc
        except TemplateError as exc:
            raise PermanentError(str(exc), kind="template") from exc
        except DispatcherError:
            raise
        except Exception as exc:
            # Whatever a vendor sends must not crash us into a retry (the
            # scheduler takes a crash for a transient error, and the retry
            # submits again): a bug met here ends the attempt for good.
            ctx.log.exception("the API runner failed on an unexpected error")
            raise PermanentError(
                f"internal error handling the provider's answer: {type(exc).__name__}: {exc}"[:300],
                kind="internal",
            ) from exc
