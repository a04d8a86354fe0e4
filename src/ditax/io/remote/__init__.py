"""Datasets, runs and exports at URLs (``gs://``, ``s3://``, any fsspec
filesystem whose package is installed).

- :mod:`~ditax.io.remote.urls`: which paths are URLs, their filesystem, one-line refusals
  (unknown protocol, the package to ``pip install``, malformed); the per-host cache folder
  (``$DITAX_REMOTE_CACHE``, else ``~/.cache/ditax/remote``).
- :mod:`~ditax.io.remote.datasets`: a remote dataset is read through a per-host local
  *mirror* (ArrayRecord reads local files; no streaming), verified by size; ``ditax
  preprocess`` to a URL writes locally and uploads, ``meta.json`` last.
- :mod:`~ditax.io.remote.runs`: a run at a URL writes to a local staging folder; finished
  checkpoints are uploaded with orbax's ``commit_success.txt`` last, and only committed ones
  are resumed from.
- :mod:`~ditax.io.remote.transfer`: the size-checked copies and the host lock they share.

Every path-or-URL a user gives goes through :func:`~ditax.io.remote.urls.resolve`: a local
path stays one (``file:///x`` is the local path ``/x``), and ``memory://`` — this process's own
store — is refused for what another process reads (a dataset, a run, an export); fsspec is
imported only for a remote URL.
"""
