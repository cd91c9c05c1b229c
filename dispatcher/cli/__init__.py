"""The command line: serve, submit, batch with live progress, status, switches.

Every command but `serve` and `demo-run` talks to the running service through
the port and token files in the state dir (``--state-dir``, else
``DISPATCHER_STATE_DIR``, else the settings' default). The token is read from
that file and sent as a header; it is never printed.

Exit codes: 0 fine; 1 a task or job failed or was canceled, or the service
refused the request; 2 bad input (arguments, batch file, settings, an unknown
model, id or account, an ambiguous id prefix); 3 the service is not running
or refused the token; 130 interrupted. With ``--json``, stdout carries one
JSON object whatever happens; errors are ``{"error": {"kind", "message"}}``.

May import: anything in `dispatcher`; the CLI is the top of the stack (the
demo's start-up step is handed to the service from here).
"""

from dispatcher.cli.commands import app, main
from dispatcher.cli.plumbing import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from dispatcher.cli.progress import (
    ClosedLanes,
    FailureFeed,
    LaneNames,
    failures_table,
    job_table,
    watch_job,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "ClosedLanes",
    "FailureFeed",
    "LaneNames",
    "app",
    "failures_table",
    "job_table",
    "main",
    "watch_job",
]
