"""Setting a task's params in the page's controls (`[web.fields]`).

Each field is set in the order the profile lists it, then read back: a
page that shows another value (a slider clamped to its range, a select
without that option, a number rounded) would render something the task did
not ask for, so the attempt stops there and says which field and what the
page shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.errors import PermanentError
from dispatcher.tasks.fingerprint import LocalFiles
from webrunner.page import PageDriver

# What kind of control a selector found: how it is set and read back.
_KIND_JS = """e => {
  if (e.tagName === 'SELECT') return 'select';
  if (e.tagName === 'TEXTAREA') return 'text';
  if (e.tagName === 'INPUT') {
    const t = (e.type || 'text').toLowerCase();
    return ['checkbox', 'radio', 'range', 'file'].includes(t) ? t : 'text';
  }
  return e.isContentEditable ? 'editable' : 'other';
}"""

# A range input is set as a user's drag would: through the native setter
# (frameworks watch it) and the input and change events.
_SET_RANGE_JS = """(e, v) => {
  const setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
  setter.call(e, v);
  e.dispatchEvent(new Event('input', {bubbles: true}));
  e.dispatchEvent(new Event('change', {bubbles: true}));
  return e.value;
}"""

_SELECTED_JS = """e => Array.from(e.selectedOptions).map(o => [o.value, o.label])"""
_FILE_NAMES_JS = """e => Array.from(e.files || []).map(f => f.name)"""

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}

FIELD_S = 30.0  # real seconds for setting one field


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise PermanentError(f"{name}: a checkbox takes true or false, not {value!r}", kind="input")


def _same(shown: str, wanted: str) -> bool:
    """Whether the page shows the value asked for (1.50 and 1.5 are the same)."""
    if shown == wanted:
        return True
    try:
        return float(shown) == float(wanted)
    except ValueError:
        return False


def _mismatch(name: str, selector: str, wanted: Any, shown: Any) -> PermanentError:
    return PermanentError(
        f"field {name} ({selector!r}) shows {str(shown)[:100]!r} after being set to "
        f"{str(wanted)[:100]!r}",
        kind="input",
    )


async def set_fields(driver: PageDriver, params: Mapping[str, Any], files: LocalFiles) -> list[str]:
    """Set each field the task gives a value, in the profile's order; the names set."""
    done: list[str] = []
    for name, selector in driver.spec.fields.items():
        value = params.get(name)
        if value is None:
            continue  # the page's own default stays
        await _set_one(driver, name, selector, value, files)
        done.append(name)
    return done


async def _set_one(
    driver: PageDriver, name: str, selector: str, value: Any, files: LocalFiles
) -> None:
    control = driver.page.locator(selector).first
    timeout_ms = driver.remaining_ms(FIELD_S)
    call = driver.call
    kind = await call(control.evaluate(_KIND_JS, timeout=timeout_ms), f"finding field {name}")
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if kind in ("checkbox", "radio"):
        wanted = _flag(name, value)
        await call(control.set_checked(wanted, timeout=timeout_ms), f"setting field {name}")
        shown: Any = await call(control.is_checked(), f"reading field {name}")
        if shown != wanted:
            raise _mismatch(name, selector, wanted, shown)
    elif kind == "range":
        shown = await call(control.evaluate(_SET_RANGE_JS, text), f"setting field {name}")
        if not _same(str(shown), text):
            raise _mismatch(name, selector, text, shown)
    elif kind == "select":
        await call(control.select_option(text, timeout=timeout_ms), f"setting field {name}")
        selected = await call(control.evaluate(_SELECTED_JS), f"reading field {name}")
        if not any(text in (str(v), str(label)) for v, label in selected):
            raise _mismatch(name, selector, text, selected)
    elif kind == "file":
        path = files.find(text)
        if path is None:
            raise PermanentError(
                f"field {name}: {text!r} is no file under the input dirs", kind="input"
            )
        await call(control.set_input_files(path, timeout=timeout_ms), f"setting field {name}")
        names = await call(control.evaluate(_FILE_NAMES_JS), f"reading field {name}")
        if path.name not in names:
            raise _mismatch(name, selector, path.name, names)
    elif kind in ("text", "editable"):
        await call(control.fill(text, timeout=timeout_ms), f"setting field {name}")
        read = control.input_value() if kind == "text" else control.inner_text()
        shown = await call(read, f"reading field {name}")
        if not _same(str(shown), text):
            raise _mismatch(name, selector, text, shown)
    else:
        raise PermanentError(
            f"field {name}: {selector!r} is no input, textarea, select or editable element",
            kind="config",
        )
