"""The profile format's features for real vendors (issue 29), as pure decisions:
nested and boolean completion, operation ids, per-profile error words,
rate-limit headers, JWT and query-key auth, inline results, defaults."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from apirunner.auth import RESIGN_SHARE, KeyRing, sign_hs256
from apirunner.classify import answer_error, classify_remote_failure, classify_status
from apirunner.inline import decode, sniff
from apirunner.ratelimits import limit_wait, parse_reset
from apirunner.remote import interpret_status, ref_from_submit
from apirunner.templates import lookup, with_query
from dispatcher.errors import PermanentError
from dispatcher.profile_calls import StatusSpec
from dispatcher.profile_extras import ErrorWords, RateLimitSpec
from dispatcher.profiles import ApiSpec, Profile, parse_profile
from dispatcher.scheduling.lanes import profile_quota
from tests.vendors.catalog_b import verify_hs256

NOW = 1_760_000_000.0


def api(**extra: Any) -> ApiSpec:
    fields: dict[str, Any] = {
        "base_url": "https://vendor.example",
        "style": "async-job",
        "submit": {"method": "POST", "path": "/jobs", "id": "id"},
        "status": {"path": "/jobs/{id}"},
        **extra,
    }
    return ApiSpec.model_validate(fields)


# -- completion ------------------------------------------------------------------
def test_index_brackets_are_dotted_paths() -> None:
    answer = {"output": ["https://cdn/x.png"], "data": {"items": [{"url": "u"}]}}
    assert lookup(answer, "output[0]") == "https://cdn/x.png"
    assert lookup(answer, "data.items[0].url") == "u"
    assert lookup(answer, "output[1]") is lookup(answer, "missing")


def test_a_boolean_done_maps_like_a_state_word() -> None:
    spec = StatusSpec(state="done", map={"true": "success", "false": "running"})
    assert interpret_status(spec, {"name": "op"}).state == "running"  # `done` left out
    assert interpret_status(spec, {"done": False}).state == "running"
    assert interpret_status(spec, {"done": True}).state == "success"


def test_failed_if_turns_a_finished_operation_into_a_failure() -> None:
    spec = StatusSpec(
        state="done",
        map={"true": "success"},
        error="error.message",
        failed_if=("error", "response.filtered"),
    )
    ok = interpret_status(spec, {"done": True, "response": {"filtered": []}})
    assert ok.state == "success"
    failed = interpret_status(spec, {"done": True, "error": {"code": 3, "message": "bad"}})
    assert (failed.state, failed.error) == ("failed", "bad")
    filtered = interpret_status(spec, {"done": True, "response": {"filtered": ["unsafe"]}})
    assert filtered.state == "failed" and "unsafe" in (filtered.error or "")


def test_an_operation_name_gives_its_last_segment_as_the_id() -> None:
    spec = api(submit={"method": "POST", "path": "/x", "id": "name", "id_last_segment": True})
    ref = ref_from_submit(spec, {"name": "models/veo/operations/abc123"})
    assert ref is not None and ref.id == "abc123"
    plain = api(submit={"method": "POST", "path": "/x", "id": "name"})
    with pytest.raises(ValueError, match="slash"):
        ref_from_submit(plain, {"name": "models/veo/operations/abc123"})


# -- error words -----------------------------------------------------------------
WORDS = ErrorWords(
    refused=("Moderation_Blocked",), quota=("insufficient_quota",), capacity=("overloaded",)
)


def test_profile_words_classify_http_answers() -> None:
    refused = classify_status(400, '{"error": {"code": "moderation_blocked"}}', words=WORDS)
    assert (refused.retryable, refused.kind) == (False, "refused")
    # OpenAI answers a spent quota with a 429: retrying it only spends time.
    quota = classify_status(429, '{"error": {"code": "insufficient_quota"}}', 2.0, WORDS)
    assert (quota.retryable, quota.kind) == (False, "quota")
    busy = classify_status(400, '{"error": "model overloaded"}', words=WORDS)
    assert (busy.retryable, busy.kind) == (True, "capacity")
    # Without the profile's words, the generic rules as before.
    assert classify_status(429, '{"error": {"code": "insufficient_quota"}}').retryable


def test_profile_words_classify_failed_jobs() -> None:
    assert classify_remote_failure("Model overloaded, try later", WORDS).kind == "capacity"
    assert classify_remote_failure("Model overloaded, try later", WORDS).retryable
    assert not classify_remote_failure("SAFETY: moderation_blocked", WORDS).retryable
    with pytest.raises(ValueError, match="empty word"):
        ErrorWords(refused=(" ",))


def test_an_answer_code_other_than_ok_is_a_failure() -> None:
    words = ErrorWords(
        code="base_resp.status_code",
        message="base_resp.status_msg",
        refused=("1026:",),
        capacity=("1002:",),
    )
    ok = {"task_id": "1026", "base_resp": {"status_code": 0, "status_msg": "success"}}
    assert answer_error(words, ok) is None
    assert answer_error(ErrorWords(), {"base_resp": {"status_code": 1}}) is None
    busy = answer_error(words, {"base_resp": {"status_code": 1002, "status_msg": "rate limit"}})
    assert busy is not None and (busy.retryable, busy.kind) == (True, "capacity")
    refused = answer_error(words, {"base_resp": {"status_code": 1026, "status_msg": "sensitive"}})
    assert refused is not None and (refused.retryable, refused.kind) == (False, "refused")
    other = answer_error(words, {"base_resp": {"status_code": 2013, "status_msg": "not found"}})
    assert other is not None and (other.retryable, other.kind) == (False, "vendor_error")


# -- rate-limit headers ------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "seconds"),
    [("1.5", 1.5), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3s", 3723.0), ("1s", 1.0)],
)
def test_reset_forms(value: str, seconds: float) -> None:
    assert parse_reset(value, NOW) == pytest.approx(min(seconds, 3600.0))


def test_reset_as_epoch_and_garbage() -> None:
    assert parse_reset(str(int(NOW + 30)), NOW) == pytest.approx(30.0)
    assert parse_reset(str(int((NOW + 30) * 1000)), NOW) == pytest.approx(30.0)
    assert parse_reset("soon", NOW) is None
    assert parse_reset("5 fortnights", NOW) is None


def test_a_spent_window_holds_and_an_open_one_does_not() -> None:
    spec = RateLimitSpec(
        remaining="x-ratelimit-remaining-requests", reset="x-ratelimit-reset-requests"
    )
    headers = {"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "2s"}
    assert limit_wait(spec, headers, NOW, refused=False) == 2.0
    open_window = {**headers, "X-RateLimit-Remaining-Requests": "3"}
    assert limit_wait(spec, open_window, NOW, refused=False) is None
    # A 429 without Retry-After: the reset header says when.
    assert limit_wait(spec, open_window, NOW, refused=True) == 2.0
    assert limit_wait(None, headers, NOW, refused=True) is None


# -- auth --------------------------------------------------------------------------
def test_hs256_is_a_jwt_the_vendor_can_verify() -> None:
    token = sign_hs256({"iss": "ak", "exp": int(NOW) + 60, "nbf": int(NOW) - 5}, "secret")
    assert verify_hs256(token, "secret", NOW) == {
        "iss": "ak",
        "exp": int(NOW) + 60,
        "nbf": int(NOW) - 5,
    }
    assert verify_hs256(token, "other", NOW) is None
    assert verify_hs256(token, "secret", NOW + 61) is None


def test_the_jwt_is_kept_and_re_signed_before_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_ACCESS", "ak-123456")
    monkeypatch.setenv("T_SECRET", "sk-abcdef")
    spec = api(
        auth_scheme="jwt-hs256", auth_env="T_ACCESS", auth_secret_env="T_SECRET", auth_ttl_s=1800
    )
    ring = KeyRing()
    first = ring.credentials(spec, NOW).headers["Authorization"]
    assert first.startswith("Bearer ")
    assert ring.credentials(spec, NOW + 600).headers["Authorization"] == first
    late = NOW + 1800 * (1 - RESIGN_SHARE) + 1
    second = ring.credentials(spec, late).headers["Authorization"]
    assert second != first
    claims = verify_hs256(second.removeprefix("Bearer "), "sk-abcdef", late)
    assert claims is not None and claims["iss"] == "ak-123456" and claims["exp"] > late + 1000


def test_jwt_needs_both_variables() -> None:
    with pytest.raises(ValueError, match="auth_secret_env"):
        api(auth_scheme="jwt-hs256", auth_env="T_ACCESS")


def test_a_query_key_goes_in_the_query(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_KEY", "k-987654")
    creds = KeyRing().credentials(api(auth_scheme="query", auth_env="T_KEY"), NOW)
    assert (creds.headers, creds.query) == ({}, {"key": "k-987654"})
    assert with_query("https://v.example/a?alt=media&key=old", creds.query) == (
        "https://v.example/a?alt=media&key=k-987654"
    )


# -- results, defaults --------------------------------------------------------------
def test_inline_results_are_bounded_and_sniffed() -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
    assert decode(base64.b64encode(png).decode(), 1024) == png
    assert decode("data:image/png;base64," + base64.b64encode(png).decode(), 1024) == png
    assert sniff(png) == ("image/png", "png")
    with pytest.raises(PermanentError):
        decode(base64.b64encode(b"x" * 4096).decode(), 1024)
    with pytest.raises(PermanentError, match="not base64"):
        decode("%%%%", 1024)


def test_fetch_values_need_fetch() -> None:
    with pytest.raises(ValueError, match="fetch"):
        api(result={"url": "file.download_url", "fetch_values": {"file_id": "file_id"}})


def test_a_default_in_a_variable_is_used_only_when_nothing_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v.toml"
    path.write_text(
        'name = "v"\nkind = "api"\nprovider = "v"\n[api]\n'
        'base_url = "${V_BASE_URL:-https://api.vendor.example}"\nstyle = "chat"\n'
        '[api.submit]\nmethod = "POST"\npath = "/x"\n[api.result]\ntext = "t"\n'
    )
    monkeypatch.delenv("V_BASE_URL", raising=False)
    profile = parse_profile(path)
    assert profile is not None and profile.api is not None
    assert profile.api.base_url == "https://api.vendor.example"
    monkeypatch.setenv("V_BASE_URL", "http://127.0.0.1:9")
    again = parse_profile(path)
    assert again is not None and again.api is not None
    assert again.api.base_url == "http://127.0.0.1:9"


def test_the_profile_quota_is_the_lane_default() -> None:
    def model(name: str, quota: int | None) -> Profile:
        fields: dict[str, Any] = {
            "base_url": "https://vendor.example",
            "submit": {"method": "POST", "path": "/x"},
            "result": {"text": "t"},
        }
        if quota is not None:
            fields["quota"] = quota
        return Profile.model_validate({"name": name, "kind": "api", "provider": "v", "api": fields})

    assert profile_quota([model("a", 3), model("b", 2)]) == 2
    assert profile_quota([model("a", None)]) is None
