"""Log set-up: one line per event, lane prefix in the message, optional JSON.

Secrets never reach a log line, nor a stored task (`dispatcher.tasks.ledger` scrubs
every error and result meta it writes). The service registers every secret it knows
(the local token, API keys from the environment, dashboard sessions) with
`redact`, and a filter on the handler masks them in whatever is logged,
including exception text. On top of that, anything shaped like a credential
(``Authorization: ...``, ``Bearer ...``, ``Cookie: ...``, ``api_key=...``)
is masked even when nobody registered it.

A line's message is capped at `MAX_MESSAGE_CHARS`, its exception text at
`MAX_EXCEPTION_CHARS`: a vendor's 10 MB id must not become 10 MB of log
per task.

``--log-format json`` (or ``DISPATCHER_LOG_FORMAT=json``) writes one JSON
object per line with ``lane``, ``task_id``, ``attempt``, ``state`` and
``stage`` as fields whenever the line is about a task: the log call passes
them as ``extra`` (`TASK_FIELDS`), nothing is parsed back out of the text.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable
from typing import Any

_SECRETS: set[str] = set()
MASK = "***"
MAX_MESSAGE_CHARS = 8 * 1024
MAX_EXCEPTION_CHARS = 64 * 1024
FORMATS = ("text", "json")
SESSION_COOKIE_NAME = "dispatcher_session"  # == dispatcher.http.security.SESSION_COOKIE

# Credential-shaped text: a header or key name, then its value (to the end of
# the quoted value or of the line). Group 1 is kept, the value is masked.
_SHAPES = (
    re.compile(r"(?i)(\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?)[^\"'\r\n]+"),
    re.compile(r"(?i)(\b(?:set-)?cookie\b[\"']?\s*[:=]\s*[\"']?)[^\"'\r\n]+"),
    re.compile(
        r"(?i)(\b(?:x-local-token|x-api-key|api[_-]?key|access[_-]?token|secret)\b"
        r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&]+"
    ),
    re.compile(r"(?i)(\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]{6,}"),
    re.compile(rf"({SESSION_COOKIE_NAME}=)[^\s;\"',&]+"),
)
# Every shape above needs one of these words (matched ignoring case); most
# lines hold none of them, and one pass of `in` checks costs a fraction of
# five regex passes.
_SHAPE_WORDS = (
    "authorization",
    "cookie",
    "token",
    "key",
    "secret",
    "bearer",
    "basic",
    SESSION_COOKIE_NAME,
)
# Case folding as `re.IGNORECASE` matches it: these two also match "i" there.
_FOLD_LIKE_RE = str.maketrans({"\u0131": "i", "\u0130": "i"})


def _may_have_shape(text: str) -> bool:
    folded = (text if text.isascii() else text.translate(_FOLD_LIKE_RE)).casefold()
    return any(word in folded for word in _SHAPE_WORDS)


def redact(secret: str | None) -> None:
    """Register a secret; from now on it is masked in every log line."""
    if secret and len(secret) >= 6:
        _SECRETS.add(secret)


def forget(secret: str | None) -> None:
    """Stop tracking a secret that can no longer be used (an expired session)."""
    if secret:
        _SECRETS.discard(secret)


def mask_secrets(text: str) -> str:
    """Mask the registered secrets only (for text whose shape is content, not a log)."""
    for secret in list(_SECRETS):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub(text: str) -> str:
    """Mask the registered secrets and anything shaped like a credential."""
    text = mask_secrets(text)
    if _may_have_shape(text):
        for shape in _SHAPES:
            text = shape.sub(lambda m: m.group(1) + MASK, text)
    return text


def scrub_json(value: Any) -> Any:
    """`scrub` applied to every string (keys included) of a JSON-like value."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub(str(k)): scrub_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_json(v) for v in value]
    return value


def _capped(text: str, max_chars: int) -> str:
    """`text` scrubbed, then cut to `max_chars` saying how much was left out.

    Cut twice: before scrubbing, so that no pattern runs over megabytes,
    with room to spare, so that a secret across the final cut is still
    whole (and masked) when it is scrubbed.
    """
    if len(text) <= max_chars:
        return scrub(text)
    text = scrub(text[: 2 * max_chars])
    return text[:max_chars] + f" [... cut: the line was over {max_chars} characters]"


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg = _capped(message, MAX_MESSAGE_CHARS)
        record.args = None
        if record.exc_text:
            record.exc_text = _capped(record.exc_text, MAX_EXCEPTION_CHARS)
        if record.stack_info:
            record.stack_info = _capped(record.stack_info, MAX_EXCEPTION_CHARS)
        return True


# The structured fields a line carries when its log call passes them as
# `extra` (see `dispatcher.tasks.ledger`, `dispatcher.scheduling.running.TaskLog`): the message
# stays for people, these are for `jq`.
TASK_FIELDS = ("lane", "task_id", "attempt", "max_attempts", "from_state", "state", "stage")


class _PerSecond:
    """A timestamp's text to the second, formatted once a second rather than
    once a line (a task logs several lines: each paid for a strftime).
    One tuple swapped whole: threads logging at once read a matching pair."""

    def __init__(self, render: Callable[[float], str]) -> None:
        self._render = render
        self._last: tuple[int, str] = (-1, "")

    def __call__(self, created: float) -> str:
        second = int(created)
        last = self._last
        if last[0] != second:
            last = (second, self._render(second))
            self._last = last
        return last[1]


class TextFormatter(logging.Formatter):
    """`asctime message`, the time to the second (as `DATE_FORMAT` says)."""

    DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(message)s", self.DATE_FORMAT)
        self._asctime = _PerSecond(
            lambda second: time.strftime(self.DATE_FORMAT, self.converter(second))
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return self._asctime(record.created)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._ts = _PerSecond(
            lambda second: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        )

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        payload: dict[str, Any] = {
            "ts": self._ts(record.created) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        fields = record.__dict__
        for key in TASK_FIELDS:
            value = fields.get(key)
            if value is not None:
                payload[key] = value
        if record.exc_text:
            payload["exception"] = record.exc_text
        if record.stack_info:
            payload["stack"] = record.stack_info
        return json.dumps(payload, ensure_ascii=False, default=str)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    # Neither format says where a line was logged from, nor its thread or
    # process: not collecting them spares every line a walk up the stack and
    # a few lookups (the logging docs' "Optimization" section). A task logs
    # a line per transition; this was a tenth of the cost of one.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # httpx logs every request URL at INFO; ours say more with less.
    for noisy in ("httpx", "httpcore", "hpack", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Uvicorn's own loggers go through this handler too (redacted, same format).
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
