"""What runs next, where, and how one attempt is held while it runs.

Owns the lanes (`lanes`: one per web account, one per API provider quota), the
pure decisions (`decisions`: what to start, reclaim, retry), the scheduler loop
(`scheduler`), the runner protocol every runner implements (`protocol`: `run(task)`
with its `RunContext`), an attempt in memory (`running`), recent run times (`runtimes`), the
providers' daily budgets (`budgets`) and what the scheduler tells about lanes
and tasks (`laneviews`).

May import: the shared top-level modules, `store`, `tasks` (the ledger writes
states), `accounts` (health and switches decide whether a lane may take work).
"""
