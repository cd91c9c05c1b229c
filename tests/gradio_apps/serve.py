"""Two real gradio apps on one loopback port, for the web runner's tests.

- ``/chat``: a streaming chat (gradio's ChatInterface) that answers
  ``echo: <message>`` word by word, with a pause after the first word.
  ``GET /__generations`` lists when each reply started and ended (wall
  clock), the app's own time apart from the page's and the runner's.
- ``/image``: a text-to-image Blocks app with seed and size controls; the
  image is a deterministic PNG of prompt, seed and size, written to a file
  (served as is: tests compare its bytes).

Run as ``python -m tests.gradio_apps.serve PORT``; prints ``ready`` once it
serves. Nothing phones home: analytics are off and the hub is offline.
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
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
from fastapi import FastAPI

from demo.api_media import png_bytes
from tests.gradio_apps.common import image_key, serve_inherited

WORD_S = 0.04
PAUSE_S = 0.4
OUT_DIR = Path(tempfile.mkdtemp(prefix="gradio-apps-"))
# Per reply: the message, when the function started and when it yielded its
# last word (time.time(), comparable with the service's rows on this machine).
GENERATIONS: list[dict[str, object]] = []


def reply(message: str, history: list[dict[str, str]]) -> Iterator[str]:
    started = time.time()
    words = f"echo: {message}".split(" ")
    for i in range(1, len(words) + 1):
        time.sleep(PAUSE_S if i == 2 else WORD_S)
        if i == len(words):
            GENERATIONS.append({"message": message, "start": started, "end": time.time()})
        yield " ".join(words[:i])


def draw(prompt: str, seed: float, size: float) -> str:
    time.sleep(0.3)  # a generation takes a moment
    key = image_key(prompt, int(seed), int(size))
    path = OUT_DIR / f"{abs(hash(key))}.png"
    path.write_bytes(png_bytes(key, side=int(size)))
    return str(path)


def image_app() -> gr.Blocks:
    with gr.Blocks(title="image") as app:
        prompt = gr.Textbox(label="Prompt", elem_id="prompt")
        with gr.Row():
            seed = gr.Number(label="Seed", value=0, precision=0, elem_id="seed")
            size = gr.Slider(16, 128, value=64, step=16, label="Size", elem_id="size")
        go = gr.Button("Generate", elem_id="go")
        out = gr.Image(label="Result", elem_id="result", type="filepath", format="png")
        go.click(draw, [prompt, seed, size], out)
    return app


def main() -> None:
    fd = int(sys.argv[1])
    app = FastAPI()
    app.add_api_route("/__generations", lambda: GENERATIONS)
    chat = gr.ChatInterface(reply, title="chat")
    app = gr.mount_gradio_app(app, chat, path="/chat", allowed_paths=[str(OUT_DIR)])
    app = gr.mount_gradio_app(app, image_app(), path="/image", allowed_paths=[str(OUT_DIR)])
    print("ready", flush=True)
    serve_inherited(app, fd)


if __name__ == "__main__":
    main()
