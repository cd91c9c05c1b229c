"""Shared builders for tests (not fixtures: plain functions, imported explicitly)."""

from __future__ import annotations

from pathlib import Path

from dispatcher.profiles import Profile

REPO = Path(__file__).resolve().parents[2]


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


def demo_chat_on(tmp_path: Path, accounts: tuple[str, ...]) -> None:
    """demo-chat on `accounts` rather than its two: a browser fewer to start
    and stop for a test that uses one account. Written where
    `tests.support.harness.running_service` collects its profiles (pass it
    `profiles=()` for demo-chat alone)."""
    target = tmp_path / "profiles"
    target.mkdir(exist_ok=True)
    text = (REPO / "profiles" / "demo-chat.toml").read_text()
    listed = 'accounts = ["demo-1", "demo-2"]'
    assert listed in text
    named = ", ".join(f'"{a}"' for a in accounts)
    (target / "demo-chat.toml").write_text(text.replace(listed, f"accounts = [{named}]"))


def traced_demo_profile(
    tmp_path: Path, name: str, accounts: tuple[str, ...], max_attempts: int = 3
) -> None:
    """demo-chat under another name and accounts, recording a Playwright trace (`trace = true`).

    Written where `tests.support.harness.running_service` collects its profiles, beside the copies.
    """
    target = tmp_path / "profiles"
    target.mkdir(exist_ok=True)
    text = (REPO / "profiles" / "demo-chat.toml").read_text()
    text = text.replace('name = "demo-chat"', f'name = "{name}"')
    text = text.replace('accounts = ["demo-1", "demo-2"]', f"accounts = {list(accounts)!r}")
    text = text.replace("[web]\n", f"max_attempts = {max_attempts}\n\n[web]\ntrace = true\n")
    (target / f"{name}.toml").write_text(text.replace("'", '"'))


def result_files(directory: Path) -> list[str]:
    """Result files left in an attempt's dir; the failure's evidence (a
    vendor's last answer, a page's screenshot and HTML, under `artifacts/`)
    is kept there on purpose."""
    if not directory.exists():
        return []
    return sorted(
        p.name
        for p in directory.rglob("*")
        if p.is_file() and "artifacts" not in p.relative_to(directory).parts
    )
