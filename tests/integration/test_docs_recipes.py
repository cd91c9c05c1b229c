"""The recipes in docs/operations.md, run as an operator would paste them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dispatcher.notify.webhooks import sign
from dispatcher.scheduling.decisions import DEDUP_WINDOW_S
from dispatcher.service.serving import start_server
from tests.support.harness import running_service
from tests.support.helpers import REPO
from tests.support.servicecli import clean_env, run_cli

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
SECRET = "whsec-docs-0123456789abcdef"


def docs_block(lang: str, containing: str) -> str:
    """The one fenced `lang` block of operations.md that mentions `containing`."""
    blocks = re.findall(rf"^```{lang}\n(.*?)^```$", OPERATIONS.read_text(), re.M | re.S)
    (found,) = [b for b in blocks if containing in b]
    return str(found)


def docs_signature_check(raw_body: bytes, headers: Headers, secret: str = SECRET) -> bool:
    """The docs' receiver code, given what it names: `secret`, `raw_body`, `request`."""
    scope = {"secret": secret, "raw_body": raw_body, "request": SimpleNamespace(headers=headers)}
    exec(docs_block("python", "X-Dispatcher-Signature"), scope)  # this repository's own text
    return bool(scope["ok"])


async def test_the_docs_signature_check_accepts_a_real_delivery_and_nothing_else(
    tmp_path: Path,
) -> None:
    heard: list[tuple[bytes, Headers]] = []

    async def hook(request: Request) -> Response:
        heard.append((await request.body(), request.headers))
        return Response(status_code=200)

    receiver = await start_server(Starlette(routes=[Route("/hook", hook, methods=["POST"])]), None)
    try:
        async with running_service(
            tmp_path, webhook_urls=[f"{receiver.url}/hook"], webhook_secret=SECRET
        ) as h:
            job = await h.job("signed", [{"model": "demo-chat-api", "params": {"prompt": "hi"}}])
            await h.wait_job(job["id"])
            deadline = asyncio.get_running_loop().time() + 20
            while not heard:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.02)
    finally:
        await receiver.stop()
    raw, headers = heard[0]
    assert json.loads(raw)["event"] == "job.finished"
    assert docs_signature_check(raw, headers)
    # A changed body, another secret, a missing signature: refused.
    assert not docs_signature_check(raw.replace(b'"success"', b'"failed"'), headers)
    assert not docs_signature_check(raw, headers, secret="someone-else-0123456789")
    unsigned = Headers({k: v for k, v in headers.items() if k != "x-dispatcher-signature"})
    assert not docs_signature_check(raw, unsigned)
    # A genuine delivery replayed an hour later: the signed timestamp gives it away.
    old = {**json.loads(raw), "timestamp": int(time.time()) - 3600}
    old_raw = json.dumps(old, separators=(",", ":")).encode()
    replayed = Headers({**headers, "x-dispatcher-signature": sign(SECRET, old_raw)})
    assert not docs_signature_check(old_raw, replayed)


def _as_this_user(command: str, state: Path, backups: Path) -> str:
    """The recipe's command without sudo and chown (the suite is one user),
    on the test's directories."""
    command = command.replace("sudo -u dispatcher ", "").replace("sudo ", "")
    command = command.replace("-o dispatcher -g dispatcher ", "")
    return command.replace("/var/lib/dispatcher", str(state)).replace("/var/backups", str(backups))


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="needs the sqlite3 CLI")
async def test_the_docs_backup_recipe_writes_files_only_the_owner_reads(tmp_path: Path) -> None:
    backups = tmp_path / "backups"
    backups.mkdir()
    recipe = docs_block("sh", ".backup")
    async with running_service(tmp_path) as h:
        task = await h.submit("demo-chat-api", "worth keeping")
        await h.wait_task(task["id"])
        # Online, while it serves, from a shell with the usual umask.
        script = "umask 022\n" + _as_this_user(recipe, h.state_dir, backups)
        done = await asyncio.to_thread(
            subprocess.run, ["sh", "-e", "-c", script], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    written = list(backups.rglob("*"))
    assert any(p.name.endswith(".db") for p in written)
    assert any(p.name.endswith(".tgz") for p in written)
    modes = {p.relative_to(backups).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in written}
    assert modes == {name: (0o700 if (backups / name).is_dir() else 0o600) for name in modes}, {
        k: oct(v) for k, v in modes.items()
    }


async def test_the_docs_results_clean_up_takes_only_old_folders_and_keeps_records_and_cache(
    tmp_path: Path,
) -> None:
    recipe = docs_block("sh", "-mtime +30")
    async with running_service(tmp_path) as h:
        job = await h.job(
            "delivered",
            [
                {"model": "demo-video", "ref": "old", "params": {"prompt": "old clip", "gen_s": 1}},
                {"model": "demo-video", "ref": "new", "params": {"prompt": "new clip", "gen_s": 1}},
            ],
        )
        done = await h.wait_job(job["id"])
        old, new = sorted(done["tasks"], key=lambda t: str(t["ref"]) != "old")
        results = h.state_dir / "results"
        month_ago = time.time() - 31 * 86400
        os.utime(results / old["id"], (month_ago, month_ago))
        script = _as_this_user(recipe, h.state_dir, tmp_path)
        cleaned = await asyncio.to_thread(
            subprocess.run, ["sh", "-e", "-c", script], capture_output=True, text=True
        )
        assert cleaned.returncode == 0, cleaned.stderr
        assert not (results / old["id"]).exists() and (results / new["id"]).is_dir()
        # The record stays; its file is said to be gone.
        assert (await h.task(old["id"]))["state"] == "success"
        gone = await h.http.get(f"/v1/tasks/{old['id']}/result")
        assert gone.status_code == 404 and "gone from disk" in gone.text
        assert (await h.http.get(f"/v1/tasks/{new['id']}/result")).status_code == 200
        collected = await asyncio.to_thread(
            run_cli,
            ["--state-dir", str(h.state_dir), "results", job["id"], "--out", str(tmp_path / "out")],
            clean_env({}),
            REPO,
        )
        assert collected.returncode == 1, collected.stdout + collected.stderr
        manifest = (tmp_path / "out" / "manifest.csv").read_text()
        (old_row,) = [line for line in manifest.splitlines() if line.startswith("old,")]
        assert "gone from disk" in old_row, manifest
        assert (tmp_path / "out" / "new.mp4").is_file()
        # The cache kept its own copy: the same task again (past the de-dup
        # window, which would answer the first task) completes from it.
        past_twins = old["created_at"] + h.service.clock.scaled(DEDUP_WINDOW_S)
        await asyncio.sleep(max(0.0, past_twins - time.time()) + 0.05)
        again = await h.wait_task((await h.submit("demo-video", "old clip", gen_s=1))["id"])
        assert again["id"] != old["id"] and again["from_cache"], again
        assert (await h.http.get(f"/v1/tasks/{again['id']}/result")).status_code == 200
