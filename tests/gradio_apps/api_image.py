"""An image app with a seed and a size, progress steps and an optional
reference image (its pixels are pasted into the corner, so the result shows it)."""

from __future__ import annotations

import time

import gradio as gr
import numpy as np
from PIL import Image


def paint(
    prompt: str,
    seed: int,
    width: int,
    height: int,
    steps: int,
    reference: Image.Image | None,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio's own idiom)
) -> Image.Image:
    rng = np.random.default_rng([int(seed), len(prompt)])
    for _ in progress.tqdm(range(int(steps))):
        time.sleep(0.05)
    pixels = rng.integers(0, 255, (int(height), int(width), 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    if reference is not None:
        image.paste(reference.convert("RGB").resize((8, 8)), (0, 0))
    return image


def build() -> gr.Blocks:
    with gr.Blocks() as demo:
        prompt = gr.Textbox(label="prompt")
        seed = gr.Number(label="seed", value=0, precision=0)
        width = gr.Slider(16, 256, value=64, step=1, label="width")
        height = gr.Slider(16, 256, value=64, step=1, label="height")
        steps = gr.Slider(1, 1000, value=4, step=1, label="steps")
        reference = gr.Image(label="reference", type="pil")
        out = gr.Image(label="image", type="pil", format="png")
        gr.Button("paint").click(
            paint, [prompt, seed, width, height, steps, reference], out, api_name="paint"
        )
    return demo
