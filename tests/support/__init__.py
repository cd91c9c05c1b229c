"""Shared test support: the service harness, builders, PostgreSQL and process helpers."""
