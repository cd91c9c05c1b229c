"""What a task costs, what a provider may spend per day, and in what order tasks run.

Pure decisions only (no I/O): the price table of a profile (`[pricing]`),
a task's estimated cost from its params, the cost a vendor reported in its
answer, the budget check a claim makes (the store runs the same rule in SQL,
atomically), and the effective priority that ages a waiting task so none
starves. Amounts are US dollars (`_usd`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dispatcher.errors import ConfigError

# A price no vendor charges for one generation: a typo (0.04 written 400)
# must not let one task spend a month's budget unnoticed.
MAX_TASK_COST_USD = 10_000.0
_SIZE = re.compile(r"^\s*(\d{1,5})\s*[xX*]\s*(\d{1,5})\s*$")


class Pricing(BaseModel):
    """`[pricing]` in a profile; every part is added up.

    per_request: each generation. per_output_second: times the task's
    `seconds_param` (default "duration"). per_image: times its `count_param`
    (default "n", 1 when absent). per_megapixel: times width x height / 1e6
    from `size` ("1024x1024") or `width` and `height`. by_param: a price per
    value of one param (`by_param = { size = { "1024x1024" = 0.04 } }`).
    usage_cost: dotted path of the cost the vendor reports in its answer,
    preferred to the table when present.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_request: float = Field(default=0.0, ge=0, le=MAX_TASK_COST_USD)
    per_output_second: float = Field(default=0.0, ge=0, le=MAX_TASK_COST_USD)
    seconds_param: str = "duration"
    default_seconds: float = Field(default=0.0, ge=0)
    per_image: float = Field(default=0.0, ge=0, le=MAX_TASK_COST_USD)
    count_param: str = "n"
    per_megapixel: float = Field(default=0.0, ge=0, le=MAX_TASK_COST_USD)
    by_param: dict[str, dict[str, float]] = Field(default_factory=dict)
    usage_cost: str | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _megapixels(params: Mapping[str, Any]) -> float:
    size = params.get("size")
    if isinstance(size, str) and (match := _SIZE.match(size)):
        return int(match[1]) * int(match[2]) / 1e6
    width, height = _number(params.get("width")), _number(params.get("height"))
    if width is not None and height is not None:
        return width * height / 1e6
    return 0.0


def estimate_cost_usd(pricing: Pricing | None, params: Mapping[str, Any]) -> float | None:
    """The task's cost from the price table; None when the profile states no prices."""
    if pricing is None:
        return None
    cost = pricing.per_request
    seconds = _number(params.get(pricing.seconds_param))
    cost += pricing.per_output_second * (
        seconds if seconds is not None else pricing.default_seconds
    )
    count = _number(params.get(pricing.count_param))
    cost += pricing.per_image * (count if count is not None else 1.0)
    cost += pricing.per_megapixel * _megapixels(params)
    for param, prices in pricing.by_param.items():
        value = params.get(param)
        if value is not None and str(value) in prices:
            cost += prices[str(value)]
    return round(min(cost, MAX_TASK_COST_USD), 6)


def reported_cost_usd(pricing: Pricing | None, answer: Any) -> float | None:
    """The cost the vendor's answer reports at `usage_cost`, bounded; None if absent."""
    if pricing is None or not pricing.usage_cost:
        return None
    value = answer
    for part in pricing.usage_cost.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    number = _number(value)
    return None if number is None else min(number, MAX_TASK_COST_USD)


def finished_cost_usd(cost_estimate_usd: float | None, result: Any) -> float | None:
    """What a finished task cost: the vendor's reported usage (the API runner
    puts it in the result's meta as `cost_usd`), else the estimate."""
    meta = result.get("meta") if isinstance(result, dict) else None
    reported = _number(meta.get("cost_usd")) if isinstance(meta, dict) else None
    return min(reported, MAX_TASK_COST_USD) if reported is not None else cost_estimate_usd


# -- budgets -------------------------------------------------------------------


def parse_budgets(text: str) -> dict[str, float]:
    """`DISPATCHER_BUDGETS`: "provider=50, other=12.5" -> dollars per day."""
    budgets: dict[str, float] = {}
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        name, sep, amount = part.partition("=")
        value = _number(amount.strip().lstrip("$")) if sep else None
        if not name.strip() or value is None:
            raise ConfigError(
                f"DISPATCHER_BUDGETS entry {part!r} is not provider=dollars (e.g. acme=50)"
            )
        budgets[name.strip()] = value
    return budgets


def day_start(now: float) -> float:
    """00:00 UTC of the day `now` falls in: a day's budget counts from then."""
    moment = datetime.fromtimestamp(now, UTC)
    return moment.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


def next_day_start(now: float) -> float:
    start = datetime.fromtimestamp(day_start(now), UTC)
    return (start + timedelta(days=1)).timestamp()


@dataclass(frozen=True)
class Budget:
    """What a claim under a provider's daily budget proves in the store."""

    provider: str
    limit_usd: float
    since: float  # 00:00 UTC today, epoch seconds


def fits_budget(*, spent_usd: float, cost_usd: float, limit_usd: float) -> bool:
    """A task starts only if its cost keeps the day's spend within the budget
    (the store's claim runs this rule in SQL; a test checks they agree)."""
    return spent_usd + cost_usd <= limit_usd + 1e-9


def budget_reason(provider: str, spent_usd: float, limit_usd: float) -> str:
    return f"budget {provider}/day: ${spent_usd:,.2f} of ${limit_usd:,.2f} spent"


# -- priorities and deadlines ----------------------------------------------------

# A waiting task gains one priority level per this many nominal seconds: a
# low-priority task waits at most (difference of priorities) x this long
# behind later higher-priority work, never forever.
AGING_STEP_S = 600.0


def effective_priority(priority: int, waited_s: float, aging_step_s: float = AGING_STEP_S) -> int:
    """The task's priority raised by one level per `aging_step_s` it has waited."""
    return priority + int(max(0.0, waited_s) // aging_step_s)


def order_key(
    *,
    priority: int,
    deadline: float | None,
    seq: int,
    created_at: float,
    now: float,
    aging_step_s: float = AGING_STEP_S,
) -> tuple[int, float, int]:
    """Sort key of a pending task (smallest runs first): higher effective
    priority, then earliest deadline (none: last), then FIFO."""
    return (
        -effective_priority(priority, now - created_at, aging_step_s),
        deadline if deadline is not None else math.inf,
        seq,
    )


def is_late(*, deadline: float | None, now: float, expected_run_s: float = 0.0) -> bool:
    """A task that cannot finish by its deadline even if it started now."""
    return deadline is not None and now + expected_run_s > deadline
