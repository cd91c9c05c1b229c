"""What remote_id stores and how a status answer is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apirunner.remote import RemoteIdRefused, RemoteRef, interpret_status, ref_from_submit
from dispatcher.profile_calls import StatusSpec
from dispatcher.profiles import load_profiles

PROFILES = Path(__file__).resolve().parents[3] / "profiles"


def test_id_only_providers_store_the_bare_id() -> None:
    profiles = load_profiles(PROFILES, {"DEMO_API_URL": "http://127.0.0.1:50001"})
    api = profiles["demo-video"].api
    assert api is not None
    ref = ref_from_submit(api, {"id": "video_1", "status": "queued"})
    assert ref == RemoteRef("video_1")
    assert ref.encode() == "video_1"
    assert RemoteRef.decode("video_1") == ref


def test_url_returning_providers_store_the_submit_answer() -> None:
    profiles = load_profiles(PROFILES, {"DEMO_API_URL": "http://127.0.0.1:50001"})
    api = profiles["demo-queue"].api
    assert api is not None
    answer = {"request_id": "r1", "status_url": "http://127.0.0.1:50001/fal/requests/r1/status"}
    ref = ref_from_submit(api, answer)
    assert ref is not None and ref.id == "r1"
    stored = ref.encode()
    assert json.loads(stored) == {"id": "r1", "submit": answer}
    assert RemoteRef.decode(stored) == ref


def test_a_submit_answer_without_an_id_names_no_job() -> None:
    profiles = load_profiles(PROFILES, {"DEMO_API_URL": "http://127.0.0.1:50001"})
    api = profiles["demo-video"].api
    assert api is not None
    assert ref_from_submit(api, {"status": "queued"}) is None
    assert ref_from_submit(api, {"id": ""}) is None
    assert ref_from_submit(api, "oops") is None


def test_status_through_the_map_and_paths() -> None:
    spec = StatusSpec(
        state="status",
        progress="progress",
        queue_position="queue_position",
        error="error.message",
        map={"IN_QUEUE": "pending", "COMPLETED": "success"},
    )
    queued = interpret_status(spec, {"status": "IN_QUEUE", "queue_position": 4})
    assert (queued.state, queued.queue_position, queued.terminal) == ("pending", 4, False)
    done = interpret_status(spec, {"status": "COMPLETED", "progress": 140})
    assert (done.state, done.progress, done.terminal) == ("success", 100.0, True)
    failed = interpret_status(spec, {"status": "failed", "error": {"message": "boom"}})
    assert (failed.state, failed.error) == ("failed", "boom")


def test_unknown_states_mean_still_running() -> None:
    spec = StatusSpec(state="status")
    assert interpret_status(spec, {"status": "warming_up"}).state == "running"
    assert interpret_status(spec, {}).state == "running"
    assert interpret_status(spec, {"status": "cancelled"}).state == "canceled"


@pytest.mark.parametrize(
    "bad", ["..", ".", "...", "a/b", "/", "a\\b", "x\x00y", "line\nbreak", " ", "x" * 257]
)
def test_a_job_id_that_could_change_the_path_is_refused(bad: str) -> None:
    profiles = load_profiles(PROFILES, {"DEMO_API_URL": "http://127.0.0.1:50001"})
    api = profiles["demo-video"].api
    assert api is not None
    with pytest.raises(RemoteIdRefused):
        ref_from_submit(api, {"id": bad})


@pytest.mark.parametrize("good", ["video_1", "a.b", "..a", "x" * 256, "\u00e9t\u00e9", 42])
def test_ordinary_job_ids_are_kept(good: object) -> None:
    profiles = load_profiles(PROFILES, {"DEMO_API_URL": "http://127.0.0.1:50001"})
    api = profiles["demo-video"].api
    assert api is not None
    ref = ref_from_submit(api, {"id": good})
    assert ref is not None and ref.id == str(good)
