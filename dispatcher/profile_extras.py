"""Profile tables for real vendors' habits (issue 29): how a failure reads,
which headers carry the rate limit, how the key is sent.

Kept apart from `dispatcher.profiles` (which embeds them in `[api]`) so
that module stays about the format's shape; nothing here names a vendor.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _lowered(words: tuple[str, ...]) -> tuple[str, ...]:
    cleaned = tuple(word.strip().lower() for word in words)
    if any(not word for word in cleaned):
        raise ValueError("an empty word would match every answer")
    return cleaned


class ErrorWords(_Strict):
    """`[api.errors]`: words (case-insensitive substrings) of a vendor's error
    answers or failed jobs, read before the generic rules.

    `refused`: the content was refused (moderation): permanent, never
    retried. `quota`: the key's credit or quota is spent: permanent, and the
    provider's lane needs attention. `capacity`: the vendor is busy: retried
    with backoff, whatever the HTTP status says."""

    refused: tuple[str, ...] = ()
    quota: tuple[str, ...] = ()
    capacity: tuple[str, ...] = ()
    # Vendors that answer errors with HTTP 200: the dotted path of the
    # answer's status code, the codes that mean success, and the message.
    # Any other code is a failure, classified by the words above (read in
    # "<code>: <message>"), else permanent.
    code: str | None = None
    ok: tuple[str, ...] = ("0",)
    message: str | None = None

    _low = field_validator("refused", "quota", "capacity")(_lowered)


class RateLimitSpec(_Strict):
    """`[api.rate_limit]`: the headers a vendor reports its limit in.

    When `remaining` reads 0 (on any answer) or a 429 carries no
    Retry-After, the lane's gate holds every request until `reset` says:
    delta seconds (``"1.5"``), a duration (``"6m0s"``, ``"20ms"``) or an
    epoch time."""

    remaining: str | None = None
    reset: str


AuthScheme = Literal["header", "query", "jwt-hs256"]


class AuthFields(_Strict):
    """The `[api]` keys of the auth schemes beyond a plain header (mixed into `ApiSpec`)."""

    # "header": auth_header = auth_prefix + $auth_env. "query": ?<auth_query>=$auth_env
    # on requests to base_url's origin. "jwt-hs256": auth_header = auth_prefix +
    # a JWT (iss = $auth_env, signed with $auth_secret_env), re-signed before expiry.
    auth_scheme: AuthScheme = "header"
    auth_query: str = "key"
    auth_secret_env: str | None = None
    auth_ttl_s: float = Field(default=1800.0, ge=60.0, le=86400.0)
