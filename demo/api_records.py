"""What the demo API provider records: its counters (`GET /__stats`) and
each async job with the phase it is in at a given moment (a job's life is a
pure function of its creation time, queue and run seconds, so every poll
answers from the clock alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    requests: int = 0
    submits: int = 0
    jobs_created: int = 0
    polls: int = 0
    results: int = 0
    downloads: int = 0
    cancels: int = 0
    chat_completions: int = 0
    duplicate_submits: int = 0
    rate_limited: int = 0
    early_requests: int = 0
    unauthorized: int = 0
    hangups: int = 0  # chat clients that left before their answer
    faults: int = 0
    max_concurrent: int = 0
    # The most generations a key ever asked for at once, refused ones
    # included: a client that respects the quota keeps this at or below it.
    max_demanded: int = 0
    max_concurrent_by_vendor: dict[str, int] = field(default_factory=dict)
    early_log: list[dict[str, float]] = field(default_factory=list)  # the last early ones
    # sha256 of every reference image each job received (demo.api_files)
    reference_hashes: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Job:
    id: str
    vendor: str
    key: str
    prompt: str
    model: str
    created: float
    queue_s: float
    run_s: float
    fail_reason: str | None = None
    canceled_at: float | None = None
    seconds: str = "4"

    @property
    def ends(self) -> float:
        share = 0.5 if self.fail_reason else 1.0  # failures come halfway through
        return self.created + self.queue_s + self.run_s * share

    def phase(self, now: float) -> str:
        if self.canceled_at is not None and self.canceled_at < self.ends:
            return "cancelled"
        if now < self.created + self.queue_s:
            return "queued"
        if now < self.ends:
            return "in_progress"
        return "failed" if self.fail_reason else "completed"

    def progress(self, now: float) -> int:
        phase = self.phase(now)
        if phase == "completed":
            return 100
        if phase != "in_progress" or self.run_s <= 0:
            return 0
        return min(99, int(100 * (now - self.created - self.queue_s) / self.run_s))
