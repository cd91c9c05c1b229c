"""An app whose one endpoint runs one call at a time: callers wait in its
queue, with a rank and an ETA from gradio's estimation events."""

from __future__ import annotations

import time
from collections import Counter

import gradio as gr

# Prompts whose function started: a call cancelled while queued never runs.
RUNS: Counter[str] = Counter()


def slow(prompt: str, seconds: float) -> str:
    RUNS[prompt] += 1
    time.sleep(float(seconds))
    return prompt.upper()


def build() -> gr.Blocks:
    with gr.Blocks() as demo:
        prompt = gr.Textbox(label="prompt")
        seconds = gr.Number(label="seconds", value=0.5)
        out = gr.Textbox(label="answer")
        gr.Button("go").click(slow, [prompt, seconds], out, api_name="slow", concurrency_limit=1)
    return demo
