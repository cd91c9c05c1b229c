"""The web runner: model chat pages driven by a real Chromium through Playwright.

``runner.WebRunner`` is the entry point; ``browser`` launches and ends one
Chromium per task (``browserkill`` kills it with its children and sweeps
its profile), ``selfcheck`` clears what a previous run left on a
profile, ``lock`` keeps an account to one dispatcher, ``page`` drives a page
from a profile's [web] selectors, each call through ``pagestep``'s guard;
``keeper`` keeps each account's browser between tasks, within the host's
memory budget (``memory`` decides, ``memorygate`` measures and closes).
"""
