"""What the gradio apps and their tests share (no gradio import: tests load it)."""

from __future__ import annotations

import socket
from typing import Any


def image_key(prompt: str, seed: int, size: int) -> str:
    """What an image is drawn from: the app and the tests draw the same."""
    return f"{prompt}|{seed}|{size}"


# The one account of `login_app.py` (gradio's `auth=`): the tests log in with it.
LOGIN_USER = "gradio-1"
LOGIN_PASSWORD = "correct horse battery"


def serve_inherited(app: Any, fd: int) -> None:
    """Serve `app` on the bound socket the test passed down as descriptor
    `fd`: the test chose the port and holds it, so no other process can
    take it between that choice and the app's start (a port picked, closed
    and handed over by number could be)."""
    import uvicorn

    sock = socket.socket(fileno=fd)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
