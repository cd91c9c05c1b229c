"""Reading PostgreSQL's `EXPLAIN (ANALYZE, FORMAT JSON)` in tests."""

from __future__ import annotations

from typing import Any


def rows_read(plan: dict[str, Any], relation: str = "tasks") -> int:
    """Rows the plan's scans of `relation` returned or passed over, all loops."""
    own = 0
    if plan.get("Relation Name") == relation:
        loops = int(plan.get("Actual Loops", 1))
        own = (int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))) * loops
    return own + sum(rows_read(child, relation) for child in plan.get("Plans", []))
