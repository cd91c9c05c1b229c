"""Real gradio apps the web runner is tested against (issue 27), served by `serve.py`."""
