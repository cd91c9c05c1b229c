"""What the gradio apps and their tests share (no gradio import: tests load it)."""

from __future__ import annotations


def image_key(prompt: str, seed: int, size: int) -> str:
    """What an image is drawn from: the app and the tests draw the same."""
    return f"{prompt}|{seed}|{size}"


# The one account of `login_app.py` (gradio's `auth=`): the tests log in with it.
LOGIN_USER = "gradio-1"
LOGIN_PASSWORD = "correct horse battery"
