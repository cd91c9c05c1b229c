"""The ComfyUI websocket's inbox: bounded by bytes, binary frames never kept."""

from __future__ import annotations

from apirunner.inbox import CLOSED, MISSED, Inbox


async def test_binary_frames_are_never_queued_and_texts_stop_at_the_budget() -> None:
    inbox = Inbox(max_bytes=100)
    await inbox.put(b"\x00" * 10_000)  # a preview
    await inbox.put("a" * 60)
    await inbox.put("b" * 60)  # over the budget: dropped, a mark in its place
    await inbox.put("c" * 60)  # dropped too, no second mark
    await inbox.put("d" * 30)  # fits what is left
    inbox.close()
    assert (inbox.skipped, inbox.dropped, inbox.queued_bytes) == (1, 2, 90)
    assert [await inbox.get() for _ in range(4)] == ["a" * 60, MISSED, "d" * 30, CLOSED]
    assert inbox.queued_bytes == 0


async def test_reading_frees_the_budget_and_rearms_the_mark() -> None:
    inbox = Inbox(max_bytes=100)
    await inbox.put("a" * 80)
    await inbox.put("b" * 80)
    assert await inbox.get() == "a" * 80
    assert await inbox.get() is MISSED
    await inbox.put("c" * 80)  # room again
    await inbox.put("d" * 80)  # over again: a new mark
    assert [await inbox.get(), await inbox.get()] == ["c" * 80, MISSED]
