"""Every error the dispatcher raises on purpose descends from one root.

    DispatcherError
    ├── ConfigError          settings or a profile are invalid (start-up refuses)
    ├── InputError           a request is malformed: unknown model, bad params (HTTP 4xx)
    │   ├── NotFound         no such task, job or account (HTTP 404)
    │   └── AmbiguousId      an id prefix names several tasks or jobs (HTTP 409)
    ├── StateConflict        the state guard refused a transition (HTTP 409)
    │   └── OnAnotherHost    a task's result files are on another host's disk (HTTP 409)
    ├── StoreError           the database failed underneath us
    ├── LockHeld             another dispatcher holds an account or the state dir
    ├── ServiceError         the local service is unreachable or answered badly (CLI)
    ├── TaskCanceled         a runner noticed the cancel request at a checkpoint
    └── RunError             one attempt of a task failed; carries `kind` and `retryable`
        ├── AccountHold      the account cannot run tasks now (a usage cap, a human
        │                    check): the task goes back on the same attempt
        ├── TransientError   worth another attempt: timeouts, resets, 408/429/5xx, stale
        └── PermanentError   another attempt would fail the same way: 4xx, refusals
            ├── AuthError        the web account is logged out (kind "auth")
            └── HostNotAllowed   the outbound allowlist refused a host (kind "allowlist")

Third-party errors (Playwright, httpx, sqlite3, psycopg) are translated into
this tree at the edge where they happen, with ``raise ... from exc``.
"""

from __future__ import annotations


class DispatcherError(Exception):
    """Root of every error the dispatcher raises on purpose."""


class ConfigError(DispatcherError):
    """Settings or a profile are invalid; the service refuses to start."""


class InputError(DispatcherError):
    """A request is malformed; the message says what to fix."""


class NotFound(InputError):
    """No task, job or account by that name."""


class AmbiguousId(InputError):
    """An id prefix matches more than one task or job; carries the candidates."""

    def __init__(self, what: str, prefix: str, candidates: list[str], *, more: bool) -> None:
        super().__init__(
            f"{what} id prefix {prefix!r} is ambiguous; it matches {', '.join(candidates)}"
            + (" and more" if more else "")
        )
        self.candidates = candidates


class StateConflict(DispatcherError):
    """The state guard refused a transition (e.g. retrying a task that succeeded)."""


class OnAnotherHost(StateConflict):
    """The files asked for are on another host sharing the database; names it."""

    def __init__(self, message: str, host: str) -> None:
        super().__init__(message)
        self.host = host


class StoreError(DispatcherError):
    """The store failed underneath us."""


class LockHeld(DispatcherError):
    """Another dispatcher holds a lock we need (an account or the state dir)."""


class ServiceError(DispatcherError):
    """The running service could not be reached or answered with an error."""


class TaskCanceled(DispatcherError):
    """Raised by a runner at a checkpoint once it has stopped a canceled task."""


class RunError(DispatcherError):
    """One attempt of a task failed.

    `kind` is a short machine-readable word stored in the task's error
    (``timeout``, ``http_429``, ``auth``, ``stale``...). `retryable` decides
    whether the retry rule may run the task again.
    """

    retryable: bool = False
    default_kind: str = "error"

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind or self.default_kind

    @property
    def message(self) -> str:
        return str(self)


# An API provider's server refused the connection: an `AccountHold` of this
# kind skips the provider for a while (`AccountBook.mark_unreachable`).
UNREACHABLE_KIND = "unreachable"


class AccountHold(RunError):
    """The account, not the task, is the problem: a usage cap (`until`, epoch
    seconds, when it lifts; None: the profile's cooldown) or a human check
    (`until` unused, the account needs attention). The scheduler puts the task
    back to pending on the same attempt and changes the account's state."""

    default_kind = "usage_limit"

    def __init__(self, message: str, *, kind: str | None = None, until: float | None = None):
        super().__init__(message, kind=kind)
        self.until = until


class TransientError(RunError):
    retryable = True
    default_kind = "transient"


class PermanentError(RunError):
    retryable = False
    default_kind = "permanent"


class AuthError(PermanentError):
    default_kind = "auth"


class HostNotAllowed(PermanentError):
    default_kind = "allowlist"
