"""``stepstream api``: the read API (CONTRACT section 4) and its tokens.

* ``app``: the composition (routes, problem handling, metrics, access log).
* ``steps``: the operator routes, built from the step store alone.
* ``deep``: raw bodies and their purge (deep store, retention port).
* ``auth``, ``tokens``: the bearer guard; the tokens file and its commands.
* ``problems``: RFC 9457 problem details and their stable types.
* ``server``: uvicorn around the app, for the command line.

See ``docs/api.md``.
"""
