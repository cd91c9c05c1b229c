"""The bundled demo backends (`--demo`): web model, API provider, ComfyUI."""

from pathlib import Path

# Reference images the sample batches use; `--demo` copies them into the
# first input dir so tasks may read them by name.
INPUTS_DIR = Path(__file__).resolve().parent / "inputs"
