"""Task intake: from a spec to the task row that would be stored.

The model's profile (or a clear refusal), reference image hashes (read in a
worker thread), the fingerprint, ComfyUI's params and seed, an earlier
identical result from the cache, a twin inside the de-duplication window.
Nothing here writes a task: the ledger decides and writes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dispatcher.clock import Clock
from dispatcher.errors import InputError
from dispatcher.flows import check_task_params
from dispatcher.hosts.modelcards import ModelCard, read_cards
from dispatcher.models import JSON, State, Task, new_id
from dispatcher.pricing import estimate_cost_usd
from dispatcher.profiles import Profile
from dispatcher.scheduling.decisions import DEDUP_WINDOW_S
from dispatcher.store import Store
from dispatcher.tasks.decodebudget import in_decode_thread
from dispatcher.tasks.fingerprint import (
    IMAGE_PARAMS,
    PROMPT_FIELDS,
    LocalFiles,
    fingerprint,
    graph_fingerprint,
    has_references,
    image_hash,
    normalize_prompt,
    reference_hashes,
)
from dispatcher.tasks.resultpaths import stored_result
from dispatcher.tasks.spec import TaskSpec
from dispatcher.tasks.webfields import check_web_params
from dispatcher.workflow import fill, with_seed


class ResultStore(Protocol):
    """The result cache as the ledger uses it (`dispatcher.tasks.cache.ResultCache`)."""

    def lookup(self, fingerprint: str, *, copy_to: Path | None = None) -> JSON | None: ...

    def store_result(self, fingerprint: str, model: str, result: JSON) -> None: ...

    def miss_here(self, fingerprint: str) -> bool: ...

    def has(self, fingerprint: str) -> bool: ...

    def store_text_here(self, fingerprint: str, model: str, result: JSON) -> bool: ...


def comfyui_params(profile: Profile, params: JSON, image_hashes: JSON) -> tuple[JSON, str]:
    """A ComfyUI task's stored params and fingerprint.

    Unknown parameters are refused here, at submit, with the known ones
    listed. The fingerprint covers the workflow filled in with what was
    asked (prompts normalised), *before* a missing seed is drawn: two
    identical shots that left the seed open are the same request and
    de-duplicate. The drawn seed is then stored in the params, so every
    attempt and every retry renders the same image.
    """
    api = profile.api
    assert api is not None
    flow = check_task_params(api.flows, params)
    asked = {
        name: normalize_prompt(value) if name in PROMPT_FIELDS and isinstance(value, str) else value
        for name, value in params.items()
    }
    graph = fill(flow.graph, flow.places(asked), asked)
    images = {name: image_hashes[name] for name in flow.images if name in image_hashes}
    task_fingerprint = graph_fingerprint(profile.name, graph, images)
    return with_seed(params, flow.inputs, _SEEDS), task_fingerprint


def check_gradio_params(profile: Profile, params: JSON) -> None:
    """A gradio task's params: only those its profile maps (a typo would
    otherwise be dropped silently and the app's default used)."""
    api = profile.api
    assert api is not None
    unknown = sorted(set(params) - set(api.inputs) - set(api.images))
    if unknown:
        known = ", ".join(sorted({*api.inputs, *api.images})) or "none"
        raise InputError(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"for {profile.name} (gradio {api.api_name}); known: {known}"
        )


# Seeds only need to differ between tasks, not to be secret.
_SEEDS = random.Random()


@dataclass
class Intake:
    """Builds tasks from specs for the ledger; counts cache hits."""

    store: Store
    clock: Clock
    profiles: Mapping[str, Profile]
    cache: ResultStore | None = None
    results_dir: Path | None = None
    reference_files: LocalFiles | None = None
    host: str | None = None  # this host: a cache answer's files are copied here
    cache_hits: int = 0
    # Models whose profile is broken (or not applied live): why, for a clear refusal.
    invalid_models: dict[str, str] = field(default_factory=dict)
    # Models only other live hosts run (several hosts on one database), as
    # last read by `learn`.
    elsewhere: dict[str, ModelCard] = field(default_factory=dict)

    async def learn(self, specs: Sequence[TaskSpec]) -> None:
        """Read what the other hosts run when a spec names a model not loaded
        here: such a task is accepted here and run there."""
        if all(s.model in self.profiles or s.model in self.invalid_models for s in specs):
            return
        rows = await self.store.served_models()
        self.elsewhere = read_cards(r for r in rows if r[0] != self.host)

    def profile(self, model: str) -> Profile | ModelCard:
        profile = self.profiles.get(model)
        if profile is None and model in self.invalid_models:
            raise InputError(f"model {model!r} is not loaded: {self.invalid_models[model]}")
        if profile is None and model in self.elsewhere:
            return self.elsewhere[model]
        if profile is None:
            known = ", ".join(sorted({*self.profiles, *self.elsewhere})) or "none loaded"
            raise InputError(f"unknown model {model!r}; known models: {known}")
        return profile

    def new_task(self, spec: TaskSpec, job_id: str | None, images: JSON | None) -> Task:
        profile = self.profile(spec.model)
        now = self.clock.now()
        params = spec.params
        if isinstance(profile, ModelCard):
            task_fingerprint = fingerprint(
                spec.model, spec.params, profile.fingerprint_fields, images=images or {}
            )
        elif profile.api is not None and profile.api.style == "comfyui":
            params, task_fingerprint = comfyui_params(profile, spec.params, images or {})
        else:
            if profile.api is not None and profile.api.style == "gradio":
                check_gradio_params(profile, spec.params)
            check_web_params(profile, spec.params)
            fields = profile.fingerprint_fields
            task_fingerprint = fingerprint(spec.model, spec.params, fields, images=images or {})
        return Task(
            id=new_id(),
            job_id=job_id,
            ref=spec.ref,
            model=spec.model,
            kind=profile.kind,
            queue=profile.queue,
            params=params,
            fingerprint=task_fingerprint,
            created_at=now,
            max_attempts=profile.max_attempts,
            force=spec.force,
            priority=spec.priority,
            deadline=spec.deadline,
            deadline_action=spec.deadline_action,
            alt_queues=tuple(self.profile(model).queue for model in spec.fallbacks),
            cost_estimate=estimate_cost_usd(profile.pricing, params),
        )

    async def image_hashes(self, specs: Sequence[TaskSpec], *, in_job: bool) -> list[JSON | None]:
        """Reference image hashes per spec, read and decoded in a worker thread.

        Files and pixels can take seconds; the event loop serves every lane
        meanwhile. Specs without images cost nothing (no thread hop).
        """
        extra = [self._extra_image_params(spec) for spec in specs]
        if not any(
            has_references(spec.params) or names for spec, names in zip(specs, extra, strict=True)
        ):
            return [None] * len(specs)

        def hash_all() -> list[JSON | None]:
            hashes: list[JSON | None] = []
            for index, (spec, names) in enumerate(zip(specs, extra, strict=True)):
                try:
                    found = reference_hashes(spec.params, self.reference_files)
                    for name in names:
                        found[name] = image_hash(
                            spec.params[name], param=name, files=self.reference_files
                        )
                    hashes.append(found)
                except InputError as exc:
                    if not in_job:
                        raise
                    raise InputError(f"tasks[{index}]: {exc}") from exc
            return hashes

        return await in_decode_thread(hash_all)

    def _extra_image_params(self, spec: TaskSpec) -> list[str]:
        """Image params a profile names beyond the standard two (ComfyUI's and
        gradio's `images`), present in this spec: hashed by pixels like the others."""
        profile = self.profiles.get(spec.model)
        if profile is None or profile.api is None or profile.api.style not in ("comfyui", "gradio"):
            return []
        return [
            name
            for name in profile.api.images
            if spec.params.get(name) is not None and name not in IMAGE_PARAMS
        ]

    def cache_lookups(self, tasks: Sequence[Task]) -> list[JSON | None]:
        """Earlier identical results, copied into each task's own folder (file work).

        Copied rather than pointed at: a later eviction must not take the
        files out from under a finished task.
        """
        found: list[JSON | None] = []
        for task in tasks:
            if task.force or self.cache is None:
                found.append(None)
                continue
            copy_to = self.results_dir.joinpath(task.id, "cache") if self.results_dir else None
            found.append(self.cache.lookup(task.fingerprint, copy_to=copy_to))
        return found

    def may_answer(self, task: Task) -> bool:
        """False when the cache surely has nothing for the task, known on the
        loop's thread (`ResultCache.miss_here`: a plain miss, counted)."""
        return not (task.force or self.cache is None or self.cache.miss_here(task.fingerprint))

    async def cache_lookup(self, task: Task) -> JSON | None:
        """`cache_lookups` of one task `may_answer` left to look for, in a
        worker thread."""
        (found,) = await asyncio.to_thread(self.cache_lookups, [task])
        return found

    def completed(self, task: Task, cached: JSON | None) -> Task:
        """The task as it is stored: done at once when an earlier result exists."""
        if cached is None:
            return task
        self.cache_hits += 1
        now = self.clock.now()
        return task.replace(
            state=State.SUCCESS,
            result=stored_result(cached, self.results_dir),
            from_cache=True,
            cost=0.0,  # an earlier result: nothing is bought
            host=self.host,
            started_at=now,
            finished_at=now,
        )

    def twin_window_start(self, task: Task) -> float | None:
        """Twins created since then count; None for a forced task (it has none)."""
        if task.force:
            return None
        return task.created_at - self.clock.scaled(DEDUP_WINDOW_S)

    async def twin(self, task: Task) -> Task | None:
        """An identical task submitted within the de-duplication window."""
        since = self.twin_window_start(task)
        if since is None:
            return None
        return await self.store.find_by_fingerprint(task.fingerprint, since)
