from __future__ import annotations

import sys
from pathlib import Path

# Tests import shared builders as `tests.helpers`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
