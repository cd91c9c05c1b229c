"""The API runner over an in-process provider (`mock_vendor`), for its unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.apirunner.mock_vendor import KEY, Bench, bench


@pytest.fixture
async def mock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bench]:
    monkeypatch.setenv("MOCK_VENDOR_KEY", KEY)
    async with bench(tmp_path) as built:
        yield built
