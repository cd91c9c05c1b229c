"""Shared builders for tests (not fixtures: plain functions, imported explicitly)."""

from __future__ import annotations

from pathlib import Path

from dispatcher.profiles import Profile

REPO = Path(__file__).resolve().parent.parent


def api_profile(name: str = "m-api", provider: str = "prov", max_attempts: int = 3) -> Profile:
    return Profile.model_validate(
        {
            "name": name,
            "kind": "api",
            "provider": provider,
            "max_attempts": max_attempts,
            "api": {
                "base_url": "http://127.0.0.1:9",
                "style": "chat",
                "submit": {"method": "POST", "path": "/v1/chat"},
                "result": {"text": "choices.0.message.content"},
            },
        }
    )


def web_profile(name: str = "m-web", accounts: tuple[str, ...] = ("acct-1",)) -> Profile:
    return Profile.model_validate(
        {
            "name": name,
            "kind": "web",
            "accounts": list(accounts),
            "web": {
                "url": "http://127.0.0.1:9/chat",
                "logged_in": "#composer",
                "input": "textarea",
                "submit": "#send",
                "answer": ".answer",
            },
        }
    )
