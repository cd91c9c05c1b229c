"""Where the CLI's output goes: a terminal, a pipe, or nowhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.helpers import REPO


def test_a_command_started_with_stdout_closed_says_what_it_would_have(tmp_path: Path) -> None:
    # `dispatcher ... >&-` in a cron line: Python starts with sys.stdout None,
    # and the consoles' width is chosen when their module is imported.
    command = f'"$0" -m dispatcher --state-dir {tmp_path} jobs >&-'
    run = subprocess.run(
        ["sh", "-c", command, sys.executable],
        cwd=REPO,
        # Not the COLUMNS this test process may carry: the width is then chosen.
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
        capture_output=True,
        text=True,
    )
    assert "Traceback" not in run.stderr, run.stderr
    # No service on that state dir: said on stderr, exit 3, as with stdout open.
    assert run.returncode == 3 and "not running" in run.stderr, run.stderr
