"""The HTTP API and dashboard on loopback: routes, bodies, limits, login view.

Owns the Starlette app and its routes (`app`), request bodies and their limits
(`bodies`, `limits`, `params`), answers (`answers`), the job view (`jobview`),
the remote-login view (`login`), the plan view (`planview`), the token and
Host checks (`security`), the OpenAPI document (`openapi`) and the dashboard's
page, static files and session cookie (`dashboard`).

May import: the shared top-level modules and every subpackage below the service
(`store`, `tasks`, `scheduling`, `accounts`, `hosts`, `notify`), and
`service.core` for the `Service` it serves.
"""
