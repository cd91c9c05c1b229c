"""A real gradio chat behind gradio's own login page (`auth=`), for the web runner's tests.

Run as ``python -m tests.gradio_apps.login_app PORT``; prints ``ready`` once it
serves. One user, ``USER`` / ``PASSWORD``. The chat answers ``echo: <message>``
word by word. Logged out, every page shows gradio's login form; a session
ends as gradio ends one: ``GET /logout`` with its cookie revokes every session
of that user, and a page already loaded only finds out when it next calls the
app (gradio answers 401 and the page shows an error).
"""

from __future__ import annotations

import os

# Before gradio is imported: it reads these at import.
os.environ.update(
    {
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "DO_NOT_TRACK": "1",
    }
)

import sys
import time
from collections.abc import Iterator

import gradio as gr
from fastapi import FastAPI

from tests.gradio_apps.common import LOGIN_PASSWORD, LOGIN_USER, serve_inherited

WORD_S = 0.03


def reply(message: str, history: list[dict[str, str]]) -> Iterator[str]:
    words = f"echo: {message}".split(" ")
    for i in range(1, len(words) + 1):
        time.sleep(WORD_S)
        yield " ".join(words[:i])


def main() -> None:
    fd = int(sys.argv[1])
    chat = gr.ChatInterface(reply, title="private chat")
    app = gr.mount_gradio_app(FastAPI(), chat, path="", auth=[(LOGIN_USER, LOGIN_PASSWORD)])
    print("ready", flush=True)
    serve_inherited(app, fd)


if __name__ == "__main__":
    main()
