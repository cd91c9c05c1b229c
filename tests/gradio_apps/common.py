"""What the gradio apps and their tests share (no gradio import: tests load it)."""

from __future__ import annotations


def image_key(prompt: str, seed: int, size: int) -> str:
    """What an image is drawn from: the app and the tests draw the same."""
    return f"{prompt}|{seed}|{size}"
