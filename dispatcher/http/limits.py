"""How much one request may carry: shared by the server's guards and the CLI's checks.

Kept free of imports so that the CLI can check a batch file against the
same numbers the server enforces without loading the server.
"""

from __future__ import annotations

MAX_BODY_BYTES = 1024 * 1024
# A job of the most tasks it may hold: 10,000 ordinary tasks are about
# 1.4 MiB of JSON, and prompts of a few hundred characters make that
# several MiB; 16 MiB leaves room for ~1.6 KiB a task while keeping what
# the service buffers and parses for one request bounded.
MAX_JOB_BODY_BYTES = 16 * 1024 * 1024
MAX_JOB_TASKS = 10_000
JOBS_PATH = "/v1/jobs"
PLAN_PATH = "/v1/plan"  # a plan carries a job's tasks: the same bound
# The longest page of a list (and the largest job whose answer carries its tasks).
MAX_LIST = 500
