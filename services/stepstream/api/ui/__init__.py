"""The run viewer: server-rendered pages under ``/ui`` over the read API's stores.

Jinja2 templates (autoescaped) and one CSS file and one ES module, served from this
package: no build step, no third-party asset, so it works air-gapped. Modules, by
what they may touch:

* ``session``, ``signin``: the sign-in cookie and the viewer's guard (tokens only);
* ``pages``, ``live``, ``present``: the operator view, from the step store alone
  (``tests/unit/test_api_isolation.py`` holds them to it);
* ``raw``: the one route that reads the deep store, a step's raw body, ``deep:read``.

:func:`viewer` composes them for :func:`stepstream.api.app.create_app`.
"""

from stepstream.api.ui.viewer import TEMPLATES, Viewer, viewer

__all__ = ["TEMPLATES", "Viewer", "viewer"]
