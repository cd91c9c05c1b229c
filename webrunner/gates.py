"""What stops an account, not a task, as a page shows it: a human check, a
usage cap, a session that is gone (issue 27: at any moment, while the page
loads as well as while it generates).

`GateRule.verdict` is a pure decision over one look at the page (`GateLook`):
the error to raise, or None. The look itself is read by the page driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dispatcher.accounts.health import parse_reset
from dispatcher.errors import AccountHold, AuthError, RunError
from dispatcher.profiles import WebSpec


@dataclass(frozen=True)
class GateLook:
    """The page's account markers as one look saw them (None: not shown)."""

    challenge: str | None  # the visible human check's text
    limit: str | None  # the visible usage cap's text
    body: str | None  # the page's text, when only a regex can spot a cap or a logout
    banner: str | None  # the visible error banner's text, for `logged_out_text`


def logged_out_error(spec: WebSpec, account: str, said: str | None = None) -> AuthError:
    """The account is logged out: it needs an operator, the task no attempt."""
    shows = f"says {said[:200]!r}" if said is not None else f"shows {spec.logged_out!r}"
    return AuthError(
        f"account {account!r} is logged out of {spec.url} (the page {shows}); log it in "
        f"with `dispatcher accounts login {account}` (or `import`), which re-enables the account"
    )


@dataclass(frozen=True)
class GateRule:
    """A profile's gates, compiled once per task."""

    spec: WebSpec
    limit_re: re.Pattern[str] | None
    logged_out_re: re.Pattern[str] | None

    @classmethod
    def of(cls, spec: WebSpec) -> GateRule:
        return cls(
            spec,
            re.compile(spec.limit_text) if spec.limit_text else None,
            re.compile(spec.logged_out_text) if spec.logged_out_text else None,
        )

    @property
    def body_needed(self) -> bool:
        """Whether a look reads the page's text: a cap pattern without a cap
        selector, or `logged_out_text` without an error banner's selector."""
        spec = self.spec
        return (not spec.limit and self.limit_re is not None) or (
            not spec.error and self.logged_out_re is not None
        )

    @property
    def banner(self) -> str | None:
        """The error banner's selector, when `logged_out_text` reads it."""
        return self.spec.error if self.logged_out_re is not None else None

    def verdict(self, look: GateLook, account: str, now: float) -> RunError | None:
        """The hold (or logout) the look shows, or None."""
        spec = self.spec
        if look.challenge is not None:
            return AccountHold(
                f"{spec.url} asks account {account!r} for a human check "
                f"({(look.challenge or spec.challenge or '')[:200]}); solve it in its browser, "
                "then re-enable the account",
                kind="challenge",
            )
        if self.logged_out_re is not None:
            said = look.banner if spec.error else look.body
            found = self.logged_out_re.search(said or "")
            if found is not None:
                return logged_out_error(spec, account, found[0])
        if not spec.limit and self.limit_re is None:
            return None
        if spec.limit:
            if look.limit is None:
                return None
            text = look.limit
        else:
            text = look.body or ""
        reset = text
        if self.limit_re is not None:
            match = self.limit_re.search(text)
            if match is None:
                return None
            groups = match.groupdict()
            reset = groups.get("reset") or (match.group(1) if match.re.groups else match[0])
        return AccountHold(
            f"account {account!r} reached its usage cap: {text.strip()[:200]}",
            kind="usage_limit",
            until=parse_reset(reset, now),
        )


# The failures a silently revoked session looks like on a page loaded while it
# was still valid: the site's backend answers 401 to the prompt, and the page
# shows only a generic error (gradio's "Error" badge) or nothing at all until
# the attempt's timeout. Stalls and browser crashes are the browser's own.
_LOGIN_LOOK_KINDS = frozenset({"page_error", "timeout"})


def worth_a_login_look(spec: WebSpec, error: RunError) -> bool:
    """Whether a failed attempt's page is loaded again to see whether the
    account was logged out meanwhile (the login form shows only on a load):
    a logout is never charged an attempt. Only when the profile names the
    logged-out marker that look would find."""
    return bool(spec.logged_out) and error.kind in _LOGIN_LOOK_KINDS
