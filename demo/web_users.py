"""Per-user conditions of the demo web model: what real sites do to one account.

``POST /__users/{username}`` with one of

- ``{"state": "limited", "reset_in_s": N}``: a usage cap; that user's pages
  show ``.usage-cap`` "You've reached your usage limit. Try again in ..."
  (at load, and instead of an answer), lifting by itself after N real seconds;
- ``{"state": "challenge"}``: a human check (``.human-check``);
- ``{"state": "logged_out"}``: that user's sessions are signed out;
- ``{"state": "ok"}``: back to normal (the sessions are valid again, as if
  the operator had logged the account back in).
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

USER_STATES = ("ok", "limited", "challenge", "logged_out")
CHALLENGE_TEXT = "Verify you are human: complete the check to continue."


@dataclass(frozen=True)
class UserCondition:
    state: str = "ok"
    reset_at: float | None = None  # epoch seconds, for "limited"


def reset_phrase(seconds: float) -> str:
    """How a site words the wait: whole minutes or hours when they fit."""
    whole = max(1, round(seconds))
    if whole % 3600 == 0:
        hours = whole // 3600
        return f"in {hours} hour{'s' if hours != 1 else ''}"
    if whole % 60 == 0:
        minutes = whole // 60
        return f"in {minutes} minute{'s' if minutes != 1 else ''}"
    return f"in {whole} seconds"


@dataclass
class DemoUsers:
    conditions: dict[str, UserCondition] = field(default_factory=dict)

    def condition(self, user: str, now: float | None = None) -> UserCondition:
        found = self.conditions.get(user, UserCondition())
        lifted = found.reset_at is not None and found.reset_at <= (now or time.time())
        if found.state == "limited" and lifted:
            self.conditions.pop(user, None)  # the cap lifted by itself
            return UserCondition()
        return found

    def signed_out(self, user: str) -> bool:
        return self.condition(user).state == "logged_out"

    def notice(self, user: str) -> tuple[str, str] | None:
        """(CSS class, text) of what a capped or checked user's page shows, or None."""
        condition = self.condition(user)
        if condition.state == "limited" and condition.reset_at is not None:
            wait = reset_phrase(condition.reset_at - time.time())
            return "usage-cap", f"You've reached your usage limit. Try again {wait}."
        if condition.state == "challenge":
            return "human-check", CHALLENGE_TEXT
        return None

    def notice_html(self, user: str) -> str:
        found = self.notice(user)
        if found is None:
            return ""
        return f'<div class="{found[0]}" role="alert">{html.escape(found[1])}</div>'

    def reset(self) -> None:
        self.conditions.clear()

    async def control(self, request: Request) -> Response:
        user = request.path_params["username"]
        try:
            body = await request.json()
            state = body["state"]
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'send JSON {"state": ...}'}, status_code=400)
        if state not in USER_STATES:
            return JSONResponse(
                {"error": f"state must be one of {list(USER_STATES)}"}, status_code=400
            )
        reset_at = None
        if state == "limited":
            reset_in_s = body.get("reset_in_s")
            if not isinstance(reset_in_s, int | float) or reset_in_s <= 0:
                return JSONResponse(
                    {"error": "limited needs reset_in_s, a positive number of seconds"},
                    status_code=400,
                )
            reset_at = time.time() + float(reset_in_s)
        if state == "ok":
            self.conditions.pop(user, None)
        else:
            self.conditions[user] = UserCondition(state, reset_at)
        return JSONResponse({"user": user, "state": state, "reset_at": reset_at})
