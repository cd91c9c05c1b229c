"""The shipped systemd environment file, read as systemd reads it, and settings errors.

systemd's EnvironmentFile= keeps everything after '=' (only a line that
starts with '#' or ';' is a comment), so a documented `KEY=value  # note`
stopped the service with an error that named neither the variable nor the
value. The example now ships as deploy/dispatcher.env.example and is parsed
here by systemd's documented rules (and by systemd's own parser, through its
environment.d generator, where that is installed).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from dispatcher.settings import Settings
from dispatcher.settings_sources import load
from tests.support.servicecli import clean_env, run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "dispatcher.env.example"
GENERATOR = Path("/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator")
OLD_DOCS_LINE = (
    'DISPATCHER_CONCURRENCY={"openai": 3, "fal": 2}    # per API provider, 1..5 (the quota)'
)
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


def parse_environment_file(text: str) -> dict[str, str]:
    """KEY=VALUE pairs as systemd.exec(5) documents EnvironmentFile=.

    Empty lines and lines beginning with ';' or '#' are ignored; a trailing
    backslash joins the next line; whitespace around the key and an unquoted
    value is dropped; a value wholly in double quotes keeps its inside with
    backslash escapes resolved, in single quotes verbatim. Nothing else is a
    comment: a '#' after a value is part of the value.
    """
    env: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if pending == "" and line.lstrip().startswith(("#", ";")):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    for line in [*logical, pending]:
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {line!r}"
        key, value = key.strip(), value.strip()
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"not a variable name: {key!r}"
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = _ESCAPED.sub(r"\1", value[1:-1])
        elif len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1]
        env[key] = value
    return env


@pytest.fixture
def no_settings_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No DISPATCHER_* of the caller's, and a working dir with no .env or dispatcher.toml."""
    for name in list(os.environ):
        if name.upper().startswith("DISPATCHER_"):
            monkeypatch.delenv(name)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_parser_keeps_an_inline_comment_as_systemd_does() -> None:
    parsed = parse_environment_file(f"# a comment\n; another\n\n{OLD_DOCS_LINE}\nA = ' b # c '\n")
    assert parsed["DISPATCHER_CONCURRENCY"].endswith("# per API provider, 1..5 (the quota)")
    assert parsed["A"] == " b # c "


def test_the_shipped_example_env_file_is_accepted_as_systemd_hands_it_over(
    no_settings_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = parse_environment_file(EXAMPLE.read_text(encoding="utf-8"))
    for name, value in env.items():
        assert "#" not in value, f"{name}: a comment after the value reaches the service"
        monkeypatch.setenv(name, value)
    settings = load()
    assert settings.concurrency == {"openai": 3, "fal": 2}
    assert settings.cache_max_bytes == 5_000_000_000
    assert settings.webhook_urls == ["https://hooks.example.com/dispatcher"]
    assert settings.webhook_secret
    known = {f"DISPATCHER_{name.upper()}" for name in Settings.model_fields}
    assert {n for n in env if n.startswith("DISPATCHER_")} <= known
    # API keys reach the process whole: no space, no comment, no quotes.
    keys = [n for n in env if not n.startswith("DISPATCHER_")]
    assert keys and all(re.fullmatch(r"[\w.-]+", env[n]) for n in keys)


@pytest.mark.skipif(not GENERATOR.is_file(), reason="systemd's environment.d generator absent")
def test_systemds_own_parser_reads_the_example_the_same(tmp_path: Path) -> None:
    # The generator reads environment.d with the parser EnvironmentFile=
    # uses (it also expands $VARS; the example has none).
    assert "$" not in EXAMPLE.read_text(encoding="utf-8")
    conf = tmp_path / "environment.d"
    conf.mkdir()
    (conf / "50-dispatcher.conf").write_text(
        EXAMPLE.read_text(encoding="utf-8") + OLD_DOCS_LINE.replace("CONCURRENCY", "OLD") + "\n"
    )
    out = subprocess.run(
        [str(GENERATOR)],
        env={"XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    systemd = parse_environment_file(out)
    ours = parse_environment_file(EXAMPLE.read_text(encoding="utf-8"))
    assert {k: systemd[k] for k in ours} == ours
    assert (
        systemd["DISPATCHER_OLD"] == parse_environment_file(OLD_DOCS_LINE)["DISPATCHER_CONCURRENCY"]
    )


def test_docs_show_no_comment_after_a_value_and_point_to_the_file() -> None:
    # Where the settings are explained, the env file's example is named.
    for doc in (ROOT / "docs" / "settings.md", ROOT / "docs" / "operations.md"):
        assert "deploy/dispatcher.env.example" in doc.read_text(encoding="utf-8"), doc
    # No doc shows a `KEY=value  # comment` line that systemd would take whole.
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(docs) > 3
    for doc in docs:
        text = doc.read_text(encoding="utf-8")
        inline = re.findall(r"^[A-Z][A-Z0-9_]*=.*[ \t]#.*$", text, re.MULTILINE)
        assert not inline, f"{doc.name}: {inline}"


def test_a_bad_value_stops_serve_with_the_variable_and_the_value(tmp_path: Path) -> None:
    env = clean_env({"DISPATCHER_STATE_DIR": str(tmp_path / "state")})
    env.update(parse_environment_file(OLD_DOCS_LINE))
    done = run_cli(["serve"], env, tmp_path, timeout_s=60)
    assert done.returncode == 2
    assert "DISPATCHER_CONCURRENCY=" in done.stderr
    assert '{"openai": 3, "fal": 2}    # per API provider' in " ".join(done.stderr.split("\n"))
    assert "comment" in done.stderr  # says what went wrong, not only that it did


def test_secret_values_are_masked_in_settings_errors(
    no_settings_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (no_settings_env / "dispatcher.toml").write_text("webhook_secret = 31415926535897\n")
    monkeypatch.setenv(
        "DISPATCHER_WEBHOOK_URLS", '["https://hook:pa55word@h.example/x?token=t0ken"'
    )
    monkeypatch.setenv("DISPATCHER_PORT", "99999")
    with pytest.raises(Exception) as caught:
        load()
    message = str(caught.value)
    assert "DISPATCHER_WEBHOOK_SECRET=*** (from dispatcher.toml" in message
    assert "DISPATCHER_PORT='99999' (from the process environment)" in message
    assert "DISPATCHER_WEBHOOK_URLS='[\"https://hook:***@h.example/x?***\"'" in message
    for secret in ("31415926535897", "pa55word", "t0ken"):
        assert secret not in message
