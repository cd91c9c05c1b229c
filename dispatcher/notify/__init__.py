"""Telling the operator's endpoints: webhooks kept in an outbox and sent, bounded.

Owns the webhook outbox and its sender loop (`webhooks`) and one bounded POST
(`send`).

May import: the shared top-level modules, `store`, `tasks`.
"""
