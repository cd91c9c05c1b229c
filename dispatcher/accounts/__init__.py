"""Who does the work: web accounts and API providers, their switches and their health.

Owns the operator's on/off switches (`switches`), accounts added while serving
(`roster`), lane health rules (`health`), what a failed run does to its account
(`failures`), browsers started ahead of work (`warmup`), the browser's
location (`browser_setup`) and the API keys (`apikeys`).

May import: the shared top-level modules, `store`, `tasks`, `scheduling`.
"""
