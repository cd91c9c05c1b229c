"""Run times of recent jobs, by model and the parameters that set a job's length.

The API runner polls a remote job densely only around its expected end
(`apirunner.polling.next_poll_wait`); the expectation comes from here. A
video model's 4-second 480p clip and its 20-second 1080p clip are different
jobs, so the history is kept per model *and* per value of the parameters
that commonly decide the length (`SHAPE_PARAMS`); the prompt does not.
In memory only, bounded in keys and in runs per key (parameter values come
from clients and are untrusted): after a restart the first jobs of each
shape poll on progress or the fixed schedule, as they did before.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatcher.profiles import Profile

# Parameter names that set how long a generation takes on the providers we
# know (durations, sizes, step and frame counts); `gen_s` is the demo's.
SHAPE_PARAMS = frozenset(
    {
        "duration",
        "seconds",
        "resolution",
        "size",
        "aspect_ratio",
        "quality",
        "width",
        "height",
        "fps",
        "num_frames",
        "steps",
        "num_inference_steps",
        "n",
        "model_version",
        "gen_s",
    }
)
MAX_VALUE_CHARS = 64
RUNS_PER_SHAPE = 20
MAX_SHAPES = 1024


def shape_key(model: str, params: Mapping[str, Any]) -> str:
    """The model and its length-setting parameters, as one bounded string."""
    shape = {
        name: _printable(str(value))
        for name, value in sorted(params.items())
        if name in SHAPE_PARAMS
    }
    return json.dumps([_printable(model), shape], separators=(",", ":"), ensure_ascii=False)


def _printable(text: str) -> str:
    """Cut to MAX_VALUE_CHARS, control characters as "?": JSON escapes each of
    those as six characters (and the key keeps other text as it is, unescaped),
    which would let a hostile value outgrow the bound."""
    return "".join(c if c.isprintable() else "?" for c in text[:MAX_VALUE_CHARS])


class RunHistory:
    """Nominal run times (started to finished) of the latest successes per shape."""

    def __init__(self, max_shapes: int = MAX_SHAPES, runs: int = RUNS_PER_SHAPE) -> None:
        self._runs = runs
        self._max_shapes = max_shapes
        self._by_shape: OrderedDict[str, deque[float]] = OrderedDict()

    def record(self, model: str, params: Mapping[str, Any], duration_s: float) -> None:
        if not math.isfinite(duration_s) or duration_s <= 0:
            return
        key = shape_key(model, params)
        runs = self._by_shape.get(key)
        if runs is None:
            runs = self._by_shape[key] = deque(maxlen=self._runs)
            while len(self._by_shape) > self._max_shapes:
                self._by_shape.popitem(last=False)  # the shape least recently run
        else:
            self._by_shape.move_to_end(key)
        runs.appendleft(duration_s)

    def durations(self, model: str, params: Mapping[str, Any]) -> tuple[float, ...]:
        """Newest first; empty when no job of this shape succeeded lately."""
        return tuple(self._by_shape.get(shape_key(model, params), ()))

    def __len__(self) -> int:
        return len(self._by_shape)


def polls(profile: Profile) -> bool:
    """Only async jobs are polled; only they need a run history by shape."""
    return profile.api is not None and profile.api.style == "async-job"
