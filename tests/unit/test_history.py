"""Run history by model and the parameters that set a job's length."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.scheduling.runtimes import MAX_VALUE_CHARS, RunHistory, shape_key


def test_the_prompt_does_not_change_the_shape_but_the_duration_does() -> None:
    a = shape_key("video", {"prompt": "a cat", "duration": 4, "resolution": "720p"})
    b = shape_key("video", {"prompt": "a dog", "resolution": "720p", "duration": 4})
    c = shape_key("video", {"prompt": "a cat", "duration": 8, "resolution": "720p"})
    assert a == b != c
    assert shape_key("other", {"duration": 4}) != shape_key("video", {"duration": 4})


def test_runs_are_kept_newest_first_per_shape_and_bounded() -> None:
    history = RunHistory(runs=3)
    for run_s in (10.0, 11.0, 12.0, 13.0):
        history.record("video", {"duration": 4, "prompt": "x"}, run_s)
    history.record("video", {"duration": 8}, 40.0)
    assert history.durations("video", {"duration": 4, "prompt": "y"}) == (13.0, 12.0, 11.0)
    assert history.durations("video", {"duration": 8}) == (40.0,)
    assert history.durations("video", {"duration": 16}) == ()


def test_the_least_recently_run_shape_is_forgotten_first() -> None:
    history = RunHistory(max_shapes=2)
    history.record("m", {"n": 1}, 1.0)
    history.record("m", {"n": 2}, 2.0)
    history.record("m", {"n": 1}, 1.5)  # shape 1 is now the most recent
    history.record("m", {"n": 3}, 3.0)
    assert history.durations("m", {"n": 2}) == ()
    assert history.durations("m", {"n": 1}) == (1.5, 1.0)
    assert len(history) == 2


@given(
    params=st.dictionaries(st.sampled_from(["size", "steps", "prompt"]), st.text(), max_size=3),
    run_s=st.floats(allow_nan=True, allow_infinity=True),
)
def test_untrusted_values_stay_bounded_and_nonsense_durations_are_dropped(
    params: dict[str, str], run_s: float
) -> None:
    history = RunHistory()
    history.record("m", params, run_s)
    kept = history.durations("m", params)
    assert all(0 < d < float("inf") for d in kept)
    assert len(shape_key("m", params)) <= 2 * (len("m") + 3 * (MAX_VALUE_CHARS + 20)) + 40
