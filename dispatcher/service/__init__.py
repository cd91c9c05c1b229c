"""One running service: start-up and shutdown in order, serving, state dir, reloads.

Owns the `Service` that opens the store and starts every part in an exit stack
(`core`), the run until a stop signal and the reload on SIGHUP (`signals`),
the HTTP server on loopback (`serving`), the state directory
(`statedir`), profile reloads (`reload`, `reload_apply`) and the event-loop
choice (`eventloop`) and the demo's start-up step the CLI hands in
(`demostartup`).

May import: anything in `dispatcher` (it is the top of the stack, below the CLI)
and the runners it starts (`webrunner`, `apirunner`); never `demo` (the CLI hands
the demo's start-up step in).
"""
