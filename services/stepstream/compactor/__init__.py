"""``stepstream compactor`` and ``stepstream purge``: retention, abandoned runs, purges.

* ``policy``: what a pass keeps, drops and closes (pure), per-company overrides.
* ``passes``: one pass over every company, through the store ports only.
* ``service``: the loop, ``--once``, ``/metrics`` and ``/healthz``, SIGTERM.
* ``purge``: the operator's purge of one run's or one company's bodies.

Import the module you need; this package imports nothing.
"""
