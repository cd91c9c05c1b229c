"""The decode budget: refused over it, together only while the costs fit."""

from __future__ import annotations

import threading

import pytest

from dispatcher.errors import InputError
from dispatcher.tasks.decodebudget import DecodeGate

WAIT_S = 30.0  # generous: only a broken gate ever waits this long


def test_a_decode_over_the_budget_is_refused_naming_it() -> None:
    gate = DecodeGate(max_bytes=1000)
    with pytest.raises(InputError) as caught, gate.hold(1001, "reference_image", "the file"):
        pass
    assert str(caught.value) == (
        "reference_image: decoding the file takes 1,001 bytes of memory "
        "(width x height x channels); the decode budget is 1,000 bytes"
    )
    assert gate.in_use == 0


def test_decodes_that_fit_together_overlap_and_one_that_does_not_waits() -> None:
    gate = DecodeGate(max_bytes=1000)
    first_in, second_in, release = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []

    def decode(name: str, cost: int, entered: threading.Event) -> None:
        with gate.hold(cost, name, name):
            order.append(name)
            entered.set()
            assert release.wait(WAIT_S)

    small = threading.Thread(target=decode, args=("small", 300, first_in))
    small.start()
    assert first_in.wait(WAIT_S)
    # 300 + 600 fit: the second runs while the first is still in.
    medium = threading.Thread(target=decode, args=("medium", 600, second_in))
    medium.start()
    assert second_in.wait(WAIT_S)
    assert gate.in_use == 900
    # 900 + 800 do not: the large one is let in only once both are out.
    large_in = threading.Event()
    large = threading.Thread(target=decode, args=("large", 800, large_in))
    large.start()
    release.set()
    for thread in (small, medium, large):
        thread.join(WAIT_S)
    assert order == ["small", "medium", "large"]
    assert gate.largest == 900 and gate.in_use == 0
