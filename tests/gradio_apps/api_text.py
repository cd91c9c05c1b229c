"""A streaming text app: each word is sent as it is "generated"."""

from __future__ import annotations

import time
from collections.abc import Iterator

import gradio as gr


def write(prompt: str, words: int) -> Iterator[str]:
    text = ""
    for index in range(int(words)):
        text += f"{prompt}-{index} "
        time.sleep(0.01)
        yield text.strip()


def broken(prompt: str) -> str:
    raise gr.Error(f"cannot write about {prompt}")


def build() -> gr.Blocks:
    with gr.Blocks() as demo:
        prompt = gr.Textbox(label="prompt")
        words = gr.Number(label="words", value=5, precision=0)
        out = gr.Textbox(label="text")
        gr.Button("write").click(write, [prompt, words], out, api_name="write")
        gr.Button("broken").click(broken, [prompt], out, api_name="broken")
    return demo
