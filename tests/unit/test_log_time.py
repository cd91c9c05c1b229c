"""A log line's time is its own record's, though formatted once a second."""

from __future__ import annotations

import json
import logging
import time

from dispatcher.logs import JsonFormatter, TextFormatter


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("t", logging.INFO, "", 0, "hello", None, None)
    record.created = created
    record.msecs = (created - int(created)) * 1000
    return record


def test_each_line_shows_its_own_second_in_text_and_json() -> None:
    text, as_json = TextFormatter(), JsonFormatter()
    # Back and forth across seconds, and again within one.
    for created in (1_700_000_000.25, 1_700_000_000.75, 1_700_000_061.5, 1_700_000_000.1):
        line = text.format(_record(created))
        expected = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
        assert line == f"{expected} INFO    hello"
        ts = json.loads(as_json.format(_record(created)))["ts"]
        utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        assert ts == f"{utc}.{int((created % 1) * 1000):03d}Z"
