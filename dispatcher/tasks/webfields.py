"""Task params a web model's page takes beyond the prompt (`[web.fields]`).

A form-like page (a text-to-image app with seed, size and negative prompt
controls) gets each param in its own control. Which params a task may name
follows from the profile: the prompt, reference images, and the fields.
Pure functions: intake refuses a task naming anything else (a 400, before
the task exists), and `dispatcher check` warns about a fingerprinted param
that no control carries (two tasks differing only in it would be told apart,
yet the page would see the same input).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.errors import InputError
from dispatcher.profiles import Profile
from dispatcher.tasks.fingerprint import IMAGE_PARAMS

PROMPT_PARAM = "prompt"


def carried_params(profile: Profile) -> tuple[str, ...]:
    """The params a web model's page receives: the prompt, its fields."""
    fields = tuple(profile.web.fields) if profile.web is not None else ()
    return (PROMPT_PARAM, *fields)


def check_web_params(profile: Profile, params: Mapping[str, Any]) -> None:
    """InputError naming the params the page has no control for.

    Only for a profile with `[web.fields]`: one without takes the prompt
    alone, and its tasks' other params were always let through (a batch
    file's columns for other models, say).
    """
    if profile.web is None or not profile.web.fields:
        return
    known = {*carried_params(profile), *IMAGE_PARAMS}
    # A param given as null is no param (a batch file's empty column).
    unknown = sorted(
        name for name, value in params.items() if name not in known and value is not None
    )
    if unknown:
        names = ", ".join(unknown)
        raise InputError(
            f"model {profile.name!r} has no field for {names}; its page takes: "
            f"{', '.join(carried_params(profile))} (the profile's [web.fields])"
        )
    for name in profile.web.fields:
        value = params.get(name)
        if isinstance(value, dict | list):
            raise InputError(f"{name}: expected a string, a number or a boolean")


def uncarried_fingerprint_fields(profile: Profile) -> list[str]:
    """Fingerprinted params a web model's page never sees.

    Only the ones the profile chose to fingerprint, or any once it has
    fields: the default list names params (seed, aspect_ratio) a plain
    chat page has no use for, and warning about each would be noise.
    """
    if profile.web is None:
        return []
    if "fingerprint_fields" not in profile.model_fields_set and not profile.web.fields:
        return []
    carried = set(carried_params(profile))
    return [name for name in profile.fingerprint_fields if name not in carried]
