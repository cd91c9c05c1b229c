from __future__ import annotations

import pytest
from hypothesis import settings

# Hypothesis's default deadline (200 ms an example) is a timed assertion: on
# a busy CI machine a plain example overran it (`DeadlineExceeded` in
# test_fingerprint under two workers). What the properties check is not
# speed: speed lives in bench/.
settings.register_profile("dispatcher", deadline=None)
settings.load_profile("dispatcher")

# `make test` runs the files on three workers (pytest-xdist, `--dist
# loadfile --no-loadscope-reorder`; why three: the Makefile): a file goes to
# whichever worker is free, in the order collected. The files that take
# longest (seconds summed by file from `--durations=0`; last on 2026-12-06,
# two full runs on three workers, quiet 2 cores) are collected first,
# longest first, and test_multi_host before them (one test of about a
# minute: started late, it alone would be the tail), so that none of them
# starts last and leaves the other workers idle while one runs it; the many
# short files then even out the workers' ends. A file not listed keeps its
# usual place after these; a renamed one only loses its head start.
HEAVY_FIRST = (
    "tests/e2e/test_multi_host.py",
    "tests/e2e/test_remote_login.py",
    "tests/integration/test_web_accounts_runtime.py",
    "tests/integration/test_browser_prewarm.py",
    "tests/integration/test_account_health.py",
    "tests/e2e/test_api_fuzz.py",
    "tests/integration/webrunner/test_web_real_sites.py",
    "tests/integration/test_web_lanes.py",
    "tests/integration/webrunner/test_web_runner.py",
    "tests/e2e/test_recovery_kill.py",
    "tests/integration/test_http_connections.py",
    "tests/integration/webrunner/test_web_hostile_page.py",
    "tests/e2e/test_dashboard_pages.py",
    "tests/integration/test_cli.py",
    "tests/integration/apirunner/test_api_hostile_vendor.py",
    "tests/integration/test_gradio_login.py",
    "tests/integration/webrunner/test_web_site_forms.py",
    "tests/integration/webrunner/test_web_memory_budget.py",
    "tests/integration/test_cli_history.py",
    "tests/integration/test_allowances_fallbacks.py",
    "tests/integration/webrunner/test_web_gradio.py",
    "tests/integration/apirunner/test_api_poll_history.py",
    "tests/integration/test_failure_evidence.py",
    "tests/integration/store/test_account_leases.py",
    "tests/integration/test_cli_intake.py",
    "tests/vendors/test_vendor_contracts.py",
    "tests/integration/webrunner/test_web_page_bounds.py",
    "tests/integration/test_browser_faults.py",
    "tests/integration/apirunner/test_api_network_faults.py",
    "tests/integration/test_gradio_flow.py",
    "tests/integration/store/test_service_postgres.py",
    "tests/integration/test_multi_provider.py",
    "tests/integration/store/test_crosshost.py",
    "tests/integration/test_comfyui_flow.py",
    "tests/integration/test_cli_reload.py",
    "tests/integration/test_job_view.py",
    "tests/integration/test_hostile_vendor_service.py",
    "tests/e2e/test_dashboard.py",
    "tests/e2e/test_sigterm.py",
    "tests/integration/test_cli_plan.py",
    "tests/integration/apirunner/test_api_runner_load.py",
    "tests/integration/test_decode_budget.py",
    "tests/integration/test_event_loop_setting.py",
    "tests/integration/test_webhook_outbox.py",
    "tests/integration/webrunner/test_web_snapshot.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    root = config.rootpath

    def place(item: pytest.Item) -> int:
        return rank.get(item.path.relative_to(root).as_posix(), len(rank))

    items.sort(key=place)  # stable: each file's own order, and the rest's, is kept
