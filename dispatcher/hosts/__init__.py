"""Several hosts on one PostgreSQL database: membership, leases, recovery, one view.

Owns this host's registration and account leases (`watch`), other hosts' writes
as local events (`crosshost`), the fate of tasks a dead host or a previous run
left running (`recovery`), the hosts view (`view`) and model cards for models
only another host runs (`modelcards`).

May import: the shared top-level modules, `store`, `tasks`, `scheduling`.
"""
