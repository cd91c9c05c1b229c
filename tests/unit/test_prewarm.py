"""Which web accounts get their browser started before their first task."""

from __future__ import annotations

from dispatcher.accounts.health import AccountState
from dispatcher.accounts.warmup import accounts_to_prewarm, came_into_service, prewarm_spec
from dispatcher.events import AccountChanged
from dispatcher.models import Kind
from tests.support.helpers import api_profile, web_profile

OK = AccountState.OK
ALL = {
    "ok-1": OK,
    "ok-2": OK,
    "off": AccountState.DISABLED,
    "login": AccountState.NEEDS_ATTENTION,
    "capped": AccountState.COOLDOWN,
}


def test_only_accounts_in_service_and_not_busy_get_a_browser() -> None:
    chosen = accounts_to_prewarm(
        [*ALL, "unknown"], states=ALL, busy={"ok-2"}, enabled=True, keep_alive_s=60
    )
    assert chosen == ["ok-1"]


def test_none_when_the_setting_is_off_or_a_kept_browser_would_close_at_once() -> None:
    assert accounts_to_prewarm(ALL, states=ALL, busy=(), enabled=False, keep_alive_s=60) == []
    assert accounts_to_prewarm(ALL, states=ALL, busy=(), enabled=True, keep_alive_s=0) == []
    assert accounts_to_prewarm(ALL, states=ALL, busy=(), enabled=True, keep_alive_s=1) == [
        "ok-1",
        "ok-2",
    ]


def _changed(
    name: str, kind: Kind, state: AccountState, before: AccountState | None
) -> AccountChanged:
    return AccountChanged(name=name, kind=kind, state=state, previous=before, view={})


def test_back_in_service_is_a_web_account_turning_ok() -> None:
    for before in (AccountState.DISABLED, AccountState.NEEDS_ATTENTION, AccountState.COOLDOWN):
        assert came_into_service(_changed("a", Kind.WEB, OK, before)) == "a"
    assert came_into_service(_changed("a", Kind.WEB, OK, OK)) is None
    assert came_into_service(_changed("a", Kind.API, OK, AccountState.DISABLED)) is None
    off = _changed("a", Kind.WEB, AccountState.DISABLED, OK)
    assert came_into_service(off) is None


def test_the_page_is_the_first_loaded_web_model_of_the_lane() -> None:
    profiles = {
        "b-web": web_profile("b-web"),
        "a-api": api_profile("a-api"),
        "c-web": web_profile("c-web"),
    }
    spec = prewarm_spec(["c-web", "gone", "b-web", "a-api"], profiles)
    assert spec is profiles["b-web"].web
    assert prewarm_spec(["gone", "a-api"], profiles) is None
