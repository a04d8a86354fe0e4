"""``ditax serve``: a loaded model behind an HTTP API (OpenAI-style ``/v1/videos`` jobs), a
durable SQLite job queue, a model thread with warm compiled programs and batching, and a web
page (:mod:`.app` routes, :mod:`.jobs` store, :mod:`.requests` checks, :mod:`.worker` and
:mod:`.batch` the model thread, ``static/`` the page). Start it with ``ditax serve``
(:mod:`ditax.cli.serve`)."""
