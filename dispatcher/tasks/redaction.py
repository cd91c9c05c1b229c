"""What a runner reports (errors, results, remote ids: a vendor's or a page's
words), made safe before the ledger stores, serves or publishes it: secrets
masked, text made storable on every store.

Pure: the ledger (`dispatcher.tasks.ledger`) calls `redacted` on every write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.logs import mask_secrets, scrub, scrub_json
from dispatcher.models import TaskError
from dispatcher.strictjson import storable, storable_text
from dispatcher.tasks.artifacts import capped_text

# An error is for a person to read; what a page's banner or a vendor says in
# it can be megabytes, stored with every attempt and served with the task.
MAX_ERROR_BYTES = 8 * 1024


def error_message(message: str) -> str:
    """The message masked, storable, and cut to MAX_ERROR_BYTES (saying so)."""
    # The same cut as an attempt's saved answer: masked before it is cut, so
    # a secret lying across the cut is masked whole.
    return capped_text(storable_text(message), MAX_ERROR_BYTES).decode()


def redacted(changes: Mapping[str, Any]) -> Mapping[str, Any]:
    """Secrets out of what a runner reports, before it is stored, served or published.

    A vendor may echo the API key in an error ("Incorrect API key provided:
    Bearer sk-..."); every error and every result's meta pass here, so
    nothing a runner produces is stored in clear. A result's text is the
    generation itself: only the registered secrets are masked there, since a
    generated answer may rightly hold text shaped like `api_key = ...`.

    Whatever a vendor sent is made storable here too (`strictjson.storable`),
    once for both stores: a NUL in an error refused by PostgreSQL used to
    fail the write that ends the attempt.
    """
    error = changes.get("error")
    result = changes.get("result")
    remote_id = changes.get("remote_id")
    if error is None and result is None and remote_id is None:
        return changes
    out = dict(changes)
    if isinstance(error, TaskError):
        out["error"] = TaskError(
            kind=storable_text(scrub(error.kind)), message=error_message(error.message)
        )
    if isinstance(result, dict):
        cleaned = storable(result)
        if "meta" in cleaned:
            cleaned["meta"] = scrub_json(cleaned["meta"])
        if isinstance(cleaned.get("text"), str):
            cleaned["text"] = mask_secrets(cleaned["text"])
        out["result"] = cleaned
    if isinstance(remote_id, str):
        out["remote_id"] = storable_text(remote_id)
    return out
