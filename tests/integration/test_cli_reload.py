"""`dispatcher check`, `dispatcher reload` and SIGHUP, as an operator runs them."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.support.helpers import REPO
from tests.support.servicecli import clean_env, run_cli, start_service

pytestmark = pytest.mark.timeout(120)


def test_check_lists_every_problem_and_exits_2(tmp_path: Path) -> None:
    target = tmp_path / "profiles"
    target.mkdir()
    shutil.copy(REPO / "profiles" / "demo-chat-api.toml", target)
    (target / "a.toml").write_text('name = "a"\nkind = "web"\ncolour = 1\nmax_attempts = 11\n')
    (target / "b.toml").write_text("name = [\n")
    env = clean_env({"DISPATCHER_STATE_DIR": str(tmp_path / "state")})
    result = run_cli(["check", str(target), "--demo"], env, tmp_path)
    assert result.returncode == 2, result.stderr
    assert "ok       demo-chat-api (api" in result.stdout
    lines = result.stderr.splitlines()
    assert any("a.toml: `colour`: unknown key" in line for line in lines)
    assert any("a.toml: `max_attempts`:" in line for line in lines)
    assert any("b.toml: `(file)`: cannot read it" in line for line in lines)
    assert "3 problem(s) in 2 file(s)" in result.stderr
    (target / "a.toml").unlink()
    (target / "b.toml").unlink()
    good = run_cli(["check", str(target), "--demo"], env, tmp_path)
    assert good.returncode == 0 and "1 profile(s) valid" in good.stdout
    # The configured dir is the default.
    env["DISPATCHER_PROFILES_DIR"] = str(target)
    assert run_cli(["check", "--demo"], env, tmp_path).returncode == 0
    missing = run_cli(["check", str(tmp_path / "nowhere")], env, tmp_path)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_reload_command_and_sighup_reread_the_profiles(tmp_path: Path) -> None:
    service = start_service(tmp_path, profiles=("demo-chat-api",))
    try:
        profiles = Path(service.env["DISPATCHER_PROFILES_DIR"])
        shutil.copy(REPO / "profiles" / "demo-video.toml", profiles)
        reloaded = service.cli("reload")
        assert reloaded.returncode == 0, reloaded.stderr
        assert "added: demo-video" in reloaded.stdout
        (profiles / "demo-video.toml").unlink()
        (profiles / "bad.toml").write_text('name = "demo-bad"\nkind = "api"\n')
        service.popen.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        with service.http() as http:
            while True:
                lanes = http.get("/v1/lanes").json()
                models = {m for lane in lanes if not lane.get("invalid") for m in lane["models"]}
                if models == {"demo-chat-api"}:
                    break
                assert time.monotonic() < deadline, lanes
                time.sleep(0.05)
        shown = service.cli("lanes")
        assert "invalid:bad.toml" in shown.stdout and "invalid" in shown.stdout
        assert "removed: demo-video" in service.log()
        add, remove = service.cli_many(
            ("accounts", "add", "acct-9", "--model", "demo-chat-api"),
            ("accounts", "remove", "acct-9", "--drain"),
        )
        assert add.returncode == 2 and "not a loaded web model: demo-chat-api" in add.stderr
        assert remove.returncode == 2 and "no web account 'acct-9'" in remove.stderr
    finally:
        assert service.stop() == 0, service.log()[-3000:]


def test_reload_says_what_changed_what_was_refused_and_which_source_won(
    tmp_path: Path,
) -> None:
    dotenv = tmp_path / ".env"  # the service's working dir is tmp_path
    dotenv.write_text("DISPATCHER_CACHE_TTL_S=50\nDISPATCHER_BROWSER_KEEP_ALIVE_S=30\n")
    service = start_service(
        tmp_path,
        profiles=("demo-chat-api",),
        env={"DISPATCHER_BROWSER_KEEP_ALIVE_S": "5"},
    )
    try:
        # An applied change is said, with where it came from.
        dotenv.write_text("DISPATCHER_CACHE_TTL_S=100\nDISPATCHER_BROWSER_KEEP_ALIVE_S=30\n")
        applied = service.cli("reload")
        assert applied.returncode == 0, applied.stderr
        out = " ".join(applied.stdout.split())
        assert "setting changed: DISPATCHER_CACHE_TTL_S = 100.0 (from .env (" in out
        assert "no changes" not in out
        # The process environment outranks the .env being edited: said, not silent.
        assert (
            "DISPATCHER_BROWSER_KEEP_ALIVE_S: '5' from the process environment wins over "
            "'30' in .env (" in out
        )
        # A refused setting: said with the variable and its value, exit 1.
        dotenv.write_text('DISPATCHER_CONCURRENCY={"demo": 2\n')
        refused = service.cli("reload")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        err = " ".join(refused.stderr.split())
        assert "settings refused" in err
        assert "DISPATCHER_CONCURRENCY='{\"demo\": 2' (from .env (" in err
        assert "no changes" not in refused.stdout
        with service.http() as http:
            answer = http.post("/v1/reload").json()
        assert answer["settings_error"] and answer["settings"] == {}
        # Back to its default: said too.
        dotenv.write_text("")
        default = " ".join(service.cli("reload").stdout.split())
        assert "setting changed: DISPATCHER_CACHE_TTL_S = 604800.0 (from its default)" in default
    finally:
        service.stop()
