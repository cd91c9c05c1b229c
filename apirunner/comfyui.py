"""ComfyUI as an API style: a workflow graph in, its output files out.

One attempt (`run_comfyui`):

1. Fill the task's params into the profile's workflow (the seed was already
   fixed when the task was created, see `dispatcher.workflow`).
2. Open the websocket ``/ws?clientId=<fresh id>`` *first*: ComfyUI sends a
   prompt's messages only to the socket named by the POST's client_id, and
   drops them when that socket is not connected yet.
3. ``POST /prompt``; store the ``prompt_id`` as the remote id before
   anything else. A 400 (or ``node_errors`` touching our outputs) is a
   permanent error naming the node and the input.
4. Follow the prompt: websocket messages give the stage and percentage; the
   end is ``executing`` with ``node: null`` (written after the history
   entry). While nothing arrives, and always once the socket drops, poll
   ``GET /history/{id}`` on the usual backoff schedule, and ``GET /queue``
   for the position while the prompt waits on the server.
5. Download every file of the chosen output nodes from ``/view``.

Reference images (``images = { reference_image = "10.inputs.image" }``) are
uploaded with ``POST /upload/image`` before step 2 and the name the server
gives back is put where the profile says.

A task that arrives with a remote id (a restart) skips 1-3 and polls: the
prompt is never posted twice while the server knows it. Cancel deletes a
queued prompt (``POST /queue {"delete": [id]}``) or interrupts a running one
(``POST /interrupt {"prompt_id": id}``, sent only when the queue shows ours
running, since older servers interrupt whatever runs) and returns only once
the server confirms: the prompt left the queue or its history is written.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from functools import partial
from typing import Any
from urllib.parse import urlencode

from apirunner.classify import decide_retry
from apirunner.client import (
    AttemptBase,
    AttemptScope,
    Call,
    CallFailed,
    profile_call,
    with_retries,
)
from apirunner.comfy_files import fetch_file, image_suffix
from apirunner.comfy_protocol import (
    Event,
    OutputFile,
    QueueSpot,
    describe_rejection,
    execution_failure,
    failing_outputs,
    output_files,
    queue_spot,
    read_outcome,
)
from apirunner.comfy_socket import ComfySocket
from apirunner.inbox import CLOSED
from apirunner.polling import poll_wait
from apirunner.templates import join_url
from dispatcher.allowlist import Allowlist, same_origin
from dispatcher.errors import (
    UNREACHABLE_KIND,
    AccountHold,
    InputError,
    PermanentError,
    TaskCanceled,
    TransientError,
)
from dispatcher.flows import Flow, choose
from dispatcher.models import Stage
from dispatcher.scheduling.protocol import ResultFile, RunResult
from dispatcher.tasks.fingerprint import LocalFiles, read_image
from dispatcher.workflow import Graph, fill

# Consecutive failed polls before the attempt gives up (as for async jobs).
MAX_POLL_ERRORS = 10
# Nominal seconds between checks while waiting for a cancel to be confirmed.
CONFIRM_WAIT_S = 0.5


async def run_comfyui(
    scope: AttemptScope,
    *,
    allowlist: Allowlist,
    max_download_bytes: int,
    reference_files: LocalFiles,
) -> RunResult:
    attempt = _ComfyAttempt(scope, allowlist)
    attempt.max_download_bytes = max_download_bytes
    attempt.reference_files = reference_files
    try:
        return await attempt.run()
    except InputError as exc:
        # Params the ledger accepted but this attempt cannot use (a reference
        # image file gone since, a profile changed under a queued task).
        raise PermanentError(str(exc), kind="input") from exc
    finally:
        await attempt.close_socket()


class _ComfyAttempt(AttemptBase):
    def __init__(self, scope: AttemptScope, allowlist: Allowlist) -> None:
        super().__init__(scope)
        self.allowlist = allowlist
        # Set by `run_comfyui`: the profile's cap, else the service's setting.
        self.max_download_bytes = 0
        # Set by `run_comfyui`: local reference images only from the input dirs.
        self.reference_files = LocalFiles((), 0)
        self.socket = ComfySocket(self.ctx, self.clock, open_timeout_s=self.http_timeout_s)
        self.polls = 0
        # The graph sent (class types for the node shown); empty on a resume.
        self.graph: Graph = {}
        # The last percentage and running node seen: a quiet poll keeps them.
        self.progress: float | None = None
        self.node: str | None = None
        self.stage = Stage.QUEUED
        # Since when (epoch s) the server refuses connections; None while it answers.
        self.away_since: float | None = None
        self.client_id: str | None = None  # the one our prompt was posted with

    # -- plumbing ----------------------------------------------------------------
    @functools.cached_property
    def flow(self) -> Flow:
        """The workflow the task picked (an `InputError` if the profile no longer has it)."""
        return choose(self.api.flows, self.task.params)

    def url(self, path: str, query: dict[str, str] | None = None) -> str:
        url = join_url(self.api.base_url, path)
        return f"{url}?{urlencode(query)}" if query else url

    def headers(self, url: str) -> dict[str, str]:
        """Headers for the websocket handshake (one hop, no redirects): the
        key only when it goes to the profile's own host."""
        headers = {"Accept": "application/json"}
        token = os.environ.get(self.api.auth_env) if self.api.auth_env else None
        if token and same_origin(url, self.api.base_url):
            headers[self.api.auth_header] = f"{self.api.auth_prefix}{token}"
        return headers

    def make_call(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        files: Mapping[str, tuple[str, bytes, str]] | None = None,
        form: Mapping[str, str] | None = None,
    ) -> Call:
        """A request through the one fetch path: the key only to the profile's
        own origin (never across a redirect), bounded by the profile's timeout."""
        return profile_call(self.api, self.clock, method, url, body, files=files, form=form)

    def call(self, method: str, path: str, body: Any = None) -> Call:
        return self.make_call(method, self.url(path), body)

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """A request that changes nothing twice (reads, delete, interrupt): retried in place."""
        answer = await with_retries(
            partial(self.client.json, self.call(method, path, body)),
            clock=self.clock,
            rand=self.rand,
        )
        return answer.data

    # -- the attempt -------------------------------------------------------------
    async def run(self) -> RunResult:
        prompt_id = self.task.remote_id
        resumed = bool(prompt_id)
        if prompt_id:
            self.ctx.log.info("resuming ComfyUI prompt %s without posting it again", prompt_id)
        else:
            try:
                prompt_id = await self.start()
            except CallFailed as exc:
                if exc.failure.kind != "connect":
                    raise
                # Nothing was queued: the task goes back on the same attempt
                # (to another server of the model, if any), and this one is
                # skipped while it refuses connections.
                raise AccountHold(
                    f"ComfyUI at {self.api.base_url} refuses connections: {exc.failure.message}",
                    kind=UNREACHABLE_KIND,
                ) from exc
            self.ctx.server_reachable()
        finished = False
        try:
            entry = await self.follow(prompt_id, poll_first=resumed)
            finished = True
            outcome = read_outcome(entry)
            if outcome.ending == "interrupted":
                self.ctx.check_canceled()
                raise PermanentError(
                    f"ComfyUI prompt {prompt_id} was interrupted on the server",
                    kind="remote_canceled",
                )
            if outcome.failure is not None:
                raise outcome.failure.to_error()
            return await self.collect(prompt_id, entry)
        except TaskCanceled:
            if not finished:
                await self.cancel_remote(prompt_id, confirm=True)
            raise
        except (TransientError, CallFailed):
            # Given up on (timeout, a server that stopped answering): free
            # the GPU. Not on CancelledError: that is a shutdown, and restart
            # recovery resumes this very prompt.
            if not finished:
                await self.cancel_remote(prompt_id, confirm=False)
            raise

    async def start(self) -> str:
        """Fill, upload, open the socket and post: the new prompt's id."""
        params = self.task.params
        graph = fill(self.flow.graph, self.flow.places(params), params)
        await self.ctx.guard(self.client.gate.wait())
        graph = await self.upload_images(graph)
        self.graph = graph
        client_id = self.client_id = uuid.uuid4().hex
        await self.open_socket(client_id)
        return await self.submit(graph, client_id)

    async def submit(self, graph: Graph, client_id: str) -> str:
        call = self.call("POST", "/prompt", {"prompt": graph, "client_id": client_id})
        errors = rate_limits = 0
        while True:
            try:
                answer = await self.client.json(call)
                break
            except CallFailed as exc:
                failure = exc.failure
                if failure.status == 400:
                    raise PermanentError(
                        describe_rejection(exc.body or ""), kind="node_errors"
                    ) from exc
                # POST /prompt is not idempotent: repeat it only when the
                # server cannot have queued it (it said so). A refused
                # connection is an outage: the caller holds the task.
                if failure.status not in (429, 503):
                    raise
                decision = decide_retry(failure, errors, rate_limits, self.rand)
                if not decision.retry:
                    raise
                rate_limits += decision.rate_limited
                errors += not decision.rate_limited
                await self.ctx.guard(self.clock.sleep(decision.wait_s))
        data = answer.data if isinstance(answer.data, dict) else {}
        prompt_id = data.get("prompt_id")
        if not isinstance(prompt_id, str) or not prompt_id or len(prompt_id) > 200:
            raise PermanentError("ComfyUI's /prompt answer has no prompt_id", kind="bad_answer")
        await self.ctx.set_remote_id(prompt_id)
        self.ctx.log.info("submitted: ComfyUI prompt %s", prompt_id)
        broken = failing_outputs(data.get("node_errors"))
        if broken and (self.flow.outputs is None or broken & set(self.flow.outputs)):
            await self.cancel_remote(prompt_id, confirm=False)
            raise PermanentError(
                describe_rejection(json.dumps({"error": "", **data})), kind="node_errors"
            )
        return prompt_id

    async def upload_images(self, graph: Graph) -> Graph:
        """Upload each reference image and put the name ComfyUI gave it in its node.

        The file is named by its content and uploaded with overwrite, so a
        retried upload or a second attempt changes nothing on the server.
        """
        names: dict[str, str] = {}
        for param in self.flow.images:
            ref = self.task.params.get(param)
            if ref is None:
                continue  # the workflow's own image stays
            data = await asyncio.to_thread(read_image, ref, param, self.reference_files)
            name = f"dispatcher-{hashlib.sha256(data).hexdigest()[:24]}{image_suffix(data)}"
            url = self.url("/upload/image")
            call = self.make_call(
                "POST",
                url,
                files={"image": (name, data, "application/octet-stream")},
                form={"overwrite": "true", "type": "input"},
            )
            answer = await self.ctx.guard(
                with_retries(partial(self.client.json, call), clock=self.clock, rand=self.rand)
            )
            stored = answer.data if isinstance(answer.data, dict) else {}
            given, sub = stored.get("name"), stored.get("subfolder") or ""
            if not isinstance(given, str) or not given or not isinstance(sub, str):
                raise PermanentError(
                    f"ComfyUI's /upload/image answer for {param} has no name", kind="bad_answer"
                )
            names[param] = f"{sub}/{given}" if sub else given
            self.ctx.log.info("uploaded %s as %s", param, names[param])
        return fill(graph, self.flow.images, names) if names else graph

    # -- following the prompt ------------------------------------------------------
    async def follow(self, prompt_id: str, *, poll_first: bool) -> Any:
        await self.ctx.set_stage(Stage.QUEUED, detail="queued on server")
        deadline = self.clock.monotonic() + self.clock.scaled(self.api.timeout_s)
        step = 0
        errors = 0
        check = poll_first
        while True:
            self.ctx.check_canceled()
            if self.clock.monotonic() >= deadline:
                raise TransientError(
                    f"ComfyUI prompt {prompt_id} not done after {self.api.timeout_s:g} s",
                    kind="timeout",
                )
            if check:
                check = False
                try:
                    entry = await self.where(prompt_id)
                except CallFailed as exc:
                    if exc.failure.kind == "connect":
                        # The server is away (stopped, restarting): wait for
                        # it, bounded by the task's timeout, and say so.
                        await self.server_away(exc.failure.message)
                    else:
                        errors += 1
                        if not exc.failure.retryable or errors >= MAX_POLL_ERRORS:
                            raise
                        self.ctx.log.debug("poll failed, polling on: %s", exc.failure.message)
                else:
                    errors = 0
                    if self.away_since is not None:
                        self.away_since = None
                        self.ctx.log.info("ComfyUI answers again")
                        await self.reconnect()
                    self.ctx.server_reachable()
                    if entry is not None:
                        return entry
            wait_s = poll_wait(step, self.rand)
            step += 1
            if not self.socket.reading:
                await self.ctx.guard(self.clock.sleep(wait_s))
                check = True
                continue
            event = await self.socket.next_event(prompt_id, wait_s)
            if event is None:  # quiet for a while: look, and get the queue position
                check = True
            elif event is CLOSED:
                self.ctx.log.info("websocket closed; following prompt %s by polling", prompt_id)
                self.socket.closed()
                step = 0
                check = True
            else:
                assert isinstance(event, Event)
                step = 0  # the socket is alive: the safety poll waits from the start
                check = await self.on_event(event)

    async def on_event(self, event: Event) -> bool:
        """Report what a message says; True when the prompt has ended."""
        if event.kind in ("started", "progress"):
            self.progress = event.progress
            await self.running()
            return False
        if event.kind == "node":
            self.node = self.describe_node(str(event.data))
            await self.running()
            return False
        if event.kind == "error":
            self.ctx.log.info("%s", execution_failure(event.data).message)
        return True

    def describe_node(self, node_id: str) -> str:
        node = self.graph.get(node_id)
        class_type = node.get("class_type") if isinstance(node, dict) else None
        return f"node {node_id} ({str(class_type)[:80]})" if class_type else f"node {node_id}"

    async def running(self) -> None:
        """The prompt runs: its percentage and the node at work."""
        self.stage = Stage.GENERATING
        await self.ctx.set_stage(Stage.GENERATING, self.progress, detail=self.node)

    async def server_away(self, reason: str) -> None:
        """A poll found the server refusing connections: the task and the
        provider show it until a poll gets an answer."""
        if self.away_since is None:
            self.away_since = self.clock.now()
            self.ctx.log.warning("ComfyUI unreachable, waiting for it: %s", reason)
        self.ctx.server_unreachable(reason)
        since = time.strftime("%H:%M:%S UTC", time.gmtime(self.away_since))
        await self.ctx.set_stage(
            self.stage, self.progress, detail=f"waiting for the server (unreachable since {since})"
        )

    async def where(self, prompt_id: str) -> Any:
        """The history entry once the prompt ended; else None, with the stage set."""
        self.polls += 1
        entry = await self.history(prompt_id)
        if entry is not None:
            return entry
        spot = queue_spot(await self.request("GET", "/queue"), prompt_id)
        if spot.place == "absent":
            # It may have ended between the two reads: history is written
            # before a prompt leaves the queue, so a second look settles it.
            entry = await self.history(prompt_id)
            if entry is not None:
                return entry
            raise TransientError(
                f"ComfyUI no longer knows prompt {prompt_id} (was the server restarted?)",
                kind="remote_lost",
            )
        if spot.place == "pending":
            # Not running yet: "generating" would be a lie while other
            # prompts go first.
            ahead = spot.ahead or 0
            self.stage = Stage.QUEUED
            await self.ctx.set_stage(
                Stage.QUEUED, None, ahead, detail=f"queued on server, {ahead} ahead"
            )
        else:
            await self.running()
        return None

    async def history(self, prompt_id: str) -> Any:
        data = await self.request("GET", f"/history/{prompt_id}")
        entry = data.get(prompt_id) if isinstance(data, dict) else None
        return entry if isinstance(entry, dict) else None

    # -- the websocket -----------------------------------------------------------
    def socket_target(self, client_id: str) -> tuple[str, dict[str, str]]:
        """The ws:// URL for `client_id` (checked against the allowlist) and its headers."""
        http_url = self.url("/ws", {"clientId": client_id})
        self.allowlist.check(http_url)
        return "ws" + http_url.removeprefix("http"), self.headers(http_url)

    async def open_socket(self, client_id: str) -> None:
        await self.socket.open(*self.socket_target(client_id))

    async def reconnect(self) -> None:
        """Back after an outage: the socket under our prompt's client_id again,
        for its progress. Safe only because the old socket is gone (ComfyUI
        drops the id's entry when an old socket of that id closes)."""
        if self.socket.reading or self.client_id is None:
            return
        await self.socket.reopen(*self.socket_target(self.client_id))

    async def close_socket(self) -> None:
        await self.socket.close()

    # -- results -------------------------------------------------------------------
    async def collect(self, prompt_id: str, entry: Any) -> RunResult:
        files = output_files(entry, self.flow.outputs)
        if not files:
            raise PermanentError(
                f"ComfyUI prompt {prompt_id} ended without files from "
                f"{'nodes ' + ', '.join(self.flow.outputs) if self.flow.outputs else 'any node'}",
                kind="no_output",
            )
        await self.ctx.set_stage(Stage.DOWNLOADING)
        results = [await self.download(item) for item in files]
        meta = {
            "provider": self.client.provider,
            "remote_id": prompt_id,
            "polls": self.polls,
            "seed": self.task.params.get("seed"),
            "outputs": [
                {"node": f.node, "filename": f.filename, "subfolder": f.subfolder, "type": f.type}
                for f in files
            ],
        }
        return RunResult(files=results, meta=meta)

    async def download(self, item: OutputFile) -> ResultFile:
        query = {"filename": item.filename, "subfolder": item.subfolder, "type": item.type}
        url = self.url("/view", query)
        download = fetch_file(
            self.client,
            self.make_call("GET", url),
            self.ctx.result_dir,
            self.clock,
            self.rand,
            stem=f"{self.task.id}-{item.node}",
            max_bytes=self.max_download_bytes,
        )
        return await self.ctx.guard(download)

    # -- cancel ------------------------------------------------------------------
    async def cancel_remote(self, prompt_id: str, *, confirm: bool) -> None:
        """Take our prompt off the server; with `confirm`, return once it is gone.

        The confirmation is bounded by the task's timeout: a server that
        stops answering must not hold the lane forever.
        """
        deadline = self.clock.monotonic() + self.clock.scaled(self.api.timeout_s)
        asked: str | None = None
        while True:
            try:
                if await self.history(prompt_id) is not None:
                    self.ctx.log.info("ComfyUI prompt %s is over (%s)", prompt_id, asked or "ended")
                    return
                spot: QueueSpot = queue_spot(await self.request("GET", "/queue"), prompt_id)
                if spot.place == "absent":
                    self.ctx.log.info("ComfyUI prompt %s left the queue", prompt_id)
                    return
                if spot.place != asked:
                    if spot.place == "pending":
                        await self.request("POST", "/queue", {"delete": [prompt_id]})
                    else:
                        await self.request("POST", "/interrupt", {"prompt_id": prompt_id})
                    asked = spot.place
                    self.ctx.log.info("ComfyUI prompt %s %s: asked to stop it", prompt_id, asked)
            except CallFailed as exc:
                self.ctx.log.warning("cancel of ComfyUI prompt %s: %s", prompt_id, exc)
                if not confirm:
                    return
            if not confirm:
                return
            if self.clock.monotonic() >= deadline:
                self.ctx.log.error(
                    "ComfyUI never confirmed the cancel of prompt %s; giving up on it", prompt_id
                )
                return
            await self.clock.sleep(CONFIRM_WAIT_S)
