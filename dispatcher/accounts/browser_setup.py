"""`make venv`'s last step: make sure a Chromium exists for the web runner.

The system package manager first when we are root; Playwright's own
download only when that is not possible (not root, not a Debian-like system).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from dispatcher.settings import find_browser


def _run(cmd: list[str]) -> bool:
    print("+", " ".join(cmd), flush=True)
    try:
        return subprocess.run(cmd, check=False, timeout=900).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"  failed: {exc}", flush=True)
        return False


def ensure_browser() -> str | None:
    found = find_browser()
    if found:
        return found
    print("no Chromium found; installing one", flush=True)
    # The distribution's package first: it gets security updates with the
    # system, and needs no download from outside the package mirrors.
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env_ok = _run(["apt-get", "update", "-qq"])
        if env_ok and _run(["apt-get", "install", "-y", "-qq", "chromium"]) and find_browser():
            return find_browser()
    if _run([sys.executable, "-m", "playwright", "install", "chromium"]) and find_browser():
        return find_browser()
    return None


def main() -> int:
    browser = ensure_browser()
    if browser is None:
        print(
            "could not install Chromium: install it yourself (e.g. `apt-get install chromium`) "
            "or set DISPATCHER_BROWSER_EXECUTABLE",
            file=sys.stderr,
        )
        return 1
    print(f"browser: {browser}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
