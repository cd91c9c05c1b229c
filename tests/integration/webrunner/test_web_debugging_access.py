"""Another local user against the service's browsers (issue 25 #1).

The browsers hold logged-in sessions. A user on the same machine who is not
us must find no way in: no debugging port in the process list, no loopback
listener that speaks DevTools, none of the browsers' descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

# What the other user runs: everything a local attacker could try without
# our uid, reported as JSON. The system's Python (ours lives under /root),
# so stdlib only.
_SPY = r"""
import base64, json, os, re, socket, struct, sys, urllib.parse, urllib.request

state_dir, listeners = sys.argv[1], json.loads(sys.argv[2])


def ask(ws_url, message):
    # A bare websocket client: one masked text frame out, one frame back.
    url = urllib.parse.urlsplit(ws_url)
    sock = socket.create_connection((url.hostname, url.port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head.split(b"\r\n")[0], head
    data, mask = message.encode(), os.urandom(4)
    size = struct.pack("!BH", 0xFE, len(data)) if len(data) > 125 else bytes([0x80 | len(data)])
    sock.sendall(bytes([0x81]) + size + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
    def exact(n):
        out = b""
        while len(out) < n:
            out += sock.recv(n - len(out))
        return out
    _, length = exact(2)
    if length == 126:
        (length,) = struct.unpack("!H", exact(2))
    elif length == 127:
        (length,) = struct.unpack("!Q", exact(8))
    return json.loads(exact(length))

found = {"uid": os.getuid(), "ports": [], "devtools": [], "cookies": [], "fds": 0}
ports = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        continue
    if not any(a.startswith("--user-data-dir=" + state_dir) for a in argv):
        continue
    for arg in argv:
        m = re.match(r"--remote-debugging-port=(\d+)$", arg)
        if m:
            ports.add(int(m.group(1)))
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK))
            found["fds"] += 1
    except OSError:
        pass
found["ports"] = sorted(ports)
for port in sorted(ports | set(listeners)):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=2) as r:
            ws_url = json.load(r)["webSocketDebuggerUrl"]
    except Exception:
        continue
    found["devtools"].append(port)
    answer = ask(ws_url, json.dumps({"id": 1, "method": "Storage.getCookies"}))
    found["cookies"] += [c["name"] for c in answer["result"]["cookies"]]
print(json.dumps(found))
"""


def _listeners(pids: list[int]) -> list[int]:
    """TCP ports these processes listen on: what an attacker who guessed
    right would try (other users' browsers on this machine are not ours to probe)."""
    ports = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(pid).net_connections("tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    ports.add(conn.laddr.port)
    return sorted(ports)


def _spy(state_dir: Path, listeners: list[int]) -> dict[str, object]:
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", _SPY, str(state_dir), json.dumps(listeners)],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another uid")
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="no system Python for the other uid")
async def test_another_user_finds_no_way_into_a_running_browser(web: WebEnv) -> None:
    runner = await web.runner(browser_keep_alive_s=600.0)
    task = web.task("secret session")
    result = await runner.run(task, web.context(task)[0])
    assert result.text == "(brief) echo: secret session"
    pid = result.meta["browser_pid"]
    assert runner.open_browsers() == {"demo-1": pid}  # kept, logged in, idle

    # The browser's family and this process (where a relay would live).
    listeners = _listeners([os.getpid(), *web.browser_pids()])
    found = await asyncio.to_thread(_spy, web.state_dir, listeners)

    assert found["uid"] == NOBODY
    assert found["cookies"] == []
    assert found["devtools"] == []
    assert found["ports"] == []
    assert found["fds"] == 0
    # The browser the spy looked at is still ours and still works.
    again = web.task("still here")
    result = await runner.run(again, web.context(again)[0])
    assert result.meta["browser_reused"] is True and result.meta["browser_pid"] == pid
