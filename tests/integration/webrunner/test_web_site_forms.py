"""The web runner filling a form (`[web.fields]`), and `dispatcher profiles
try` run by an operator against a page, on the local site of localsite.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from demo.api_media import png_bytes
from dispatcher.errors import PermanentError
from tests.integration.webrunner.localsite import (
    RETRY_BUTTON,
    Site,
    page_html,
    site_profile,
    site_task,
    start_runner,
)
from tests.support.servicecli import clean_env

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]


# -- forms: [web.fields] -------------------------------------------------------

FORM = """<div id="app">
<textarea id="q"></textarea>
<input id="seed" type="number" value="-1">
<textarea id="neg"></textarea>
<input id="steps" type="range" min="1" max="50" value="20">
<select id="size"><option value="512">512 px</option><option value="768">768 px</option></select>
<label><input id="hd" type="checkbox"> HD</label>
<input id="ref" type="file">
<button id="go">Go</button><div id="out"></div></div>"""

FORM_JS = """
const order = [];
for (const id of ['seed', 'neg', 'steps', 'size', 'hd', 'ref']) {
  document.getElementById(id).addEventListener('input', () => {
    if (!order.includes(id)) order.push(id);
  });
}
const $ = id => document.getElementById(id);
$('go').onclick = () => {
  const got = {prompt: $('q').value, seed: $('seed').value, neg: $('neg').value,
    steps: $('steps').value, size: $('size').value, hd: $('hd').checked,
    ref: $('ref').files.length ? $('ref').files[0].name : null, order: order};
  $('out').innerHTML = '<div class="answer"></div>';
  $('out').firstChild.textContent = JSON.stringify(got);
  $('out').insertAdjacentHTML('beforeend', '<span id="fin">ok</span>');
};
"""

FIELDS = {
    "seed": "#seed",
    "negative_prompt": "#neg",
    "steps": "#steps",
    "size": "#size",
    "hd": "#hd",
    "init_image": "#ref",
}


async def test_fields_are_set_in_the_profiles_order_and_reach_the_page(
    web: WebEnv, site: Site
) -> None:
    site.html["form"] = page_html(FORM_JS, body=FORM)
    inputs = web.settings.resolved_input_dirs[0]
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / "start.png").write_bytes(png_bytes("start"))
    runner = await start_runner(web, site_profile(site, "form", fields=FIELDS, done="#fin"))
    task = site_task("a lighthouse")
    task.params.update(
        seed=42,
        negative_prompt="blurry, text",
        steps=37,
        size="768 px",
        hd=True,
        init_image="start.png",
    )
    result = await runner.run(task, web.context(task)[0])
    assert result.text is not None
    assert json.loads(result.text) == {
        "prompt": "a lighthouse",
        "seed": "42",
        "neg": "blurry, text",
        "steps": "37",
        "size": "768",
        "hd": True,
        "ref": "start.png",
        "order": ["seed", "neg", "steps", "size", "hd", "ref"],
    }


async def test_a_value_the_page_will_not_show_fails_naming_the_field(
    web: WebEnv, site: Site
) -> None:
    site.html["form"] = page_html(FORM_JS, body=FORM)
    runner = await start_runner(web, site_profile(site, "form", fields=FIELDS, done="#fin"))
    task = site_task()
    task.params["steps"] = 500  # the slider stops at 50
    with pytest.raises(PermanentError, match=r"field steps .* shows '50'"):
        await runner.run(task, web.context(task)[0])


# -- dispatcher profiles try -----------------------------------------------------


async def _try(tmp_path: Path, site: Site, page: str, **web: Any) -> tuple[int, str, Path]:
    """`dispatcher profiles try site "two words"` in a second process, as an operator runs it."""
    profiles = tmp_path / "try-profiles"
    profiles.mkdir(exist_ok=True)
    spec = site_profile(site, page, **web).web
    assert spec is not None
    lines = ['name = "site"', 'kind = "web"', 'accounts = ["demo-1"]', "[web]"]
    for key, value in spec.model_dump(exclude_defaults=True).items():
        lines.append(f"{key} = {json.dumps(value)}")
    (profiles / "site.toml").write_text("\n".join(lines) + "\n")
    out = tmp_path / "shots"
    env = clean_env({"DISPATCHER_STATE_DIR": str(tmp_path / "try-state")})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatcher",
        "profiles",
        "try",
        "site",
        "two words",
        "--profiles-dir",
        str(profiles),
        "--out",
        str(out),
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, output.decode(), out


async def test_profiles_try_prints_each_step_with_a_screenshot(tmp_path: Path, site: Site) -> None:
    site.html["retry"] = page_html(RETRY_BUTTON)
    code, output, out = await _try(tmp_path, site, "retry", done="#retry", timeout_s=60)
    assert code == 0, output
    steps = ["browser started", "page loaded, logged in", "submitted", "answer growing", "done"]
    positions = [output.find(step) for step in steps]
    assert -1 not in positions and positions == sorted(positions), output
    assert "answer: 'echo: two words'" in output
    shots = sorted(p.name for p in out.glob("*.png"))
    assert len(shots) >= 4 and shots[0].startswith("01-page-loaded"), shots


async def test_profiles_try_names_the_selector_that_matched_nothing(
    tmp_path: Path, site: Site
) -> None:
    site.html["retry"] = page_html(RETRY_BUTTON)
    # The answer is `#out .answer`; this profile looks for `#out .reply`.
    code, output, out = await _try(
        tmp_path, site, "retry", answer="#out .reply", done="#retry", timeout_s=2
    )
    assert code == 1, output
    assert "`answer` = '#out .reply' matches nothing; nearest: '#out' holds" in output
    assert "echo: two words" in output  # what the page shows there
    assert any(p.name.endswith("-failed.png") for p in out.glob("*.png"))

    # A selector with nothing to narrow down: the page's own text (bounded) is shown.
    code, output, _ = await _try(
        tmp_path, site, "retry", answer=".reply", done="#retry", timeout_s=2
    )
    assert code == 1, output
    assert "`answer` = '.reply' matches nothing; the page (" in output
    assert "shows: 'Go echo: two words" in output
