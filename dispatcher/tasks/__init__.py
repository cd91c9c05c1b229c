"""A task's life on record: what a client may ask for, how it is admitted, and every state write.

Owns the task spec and intake (`spec`, `intake`, `batchfile`, `inputfiles`), the
fingerprint and result cache (`fingerprint`, `decodebudget`, `cache`), the ledger
that makes every state change (`ledger`, `states`, `reads`, `lines`), what a
runner reports made safe before it is stored (`redaction`) and where
results and failure evidence live (`resultpaths`, `artifacts`), a web task's
form params (`webfields`) and the plan of a batch before it runs (`planning`,
with its simulated schedule in `makespan`).

May import: the shared top-level modules, `store`, `scheduling.decisions` (pure
rules), `scheduling.withend` (a lane's claim sent with an end write),
`hosts.modelcards` (models other hosts run), `http.limits` and `http.bodies`
(the request shapes a batch file shares with the API).
"""
