"""Families a test defines, registered for the test's module only: :func:`families_restored`
snapshots the family registry and the pipeline families and puts them back on exit, so a
test module's toy family is not listed in another module's messages (xdist runs modules in
any order on a worker)."""

import contextlib

from ditax.models import registry
from ditax.pipelines import family as pipeline_families


@contextlib.contextmanager
def families_restored():
    registry.spec("wan")    # the built-in family, imported once, stays registered
    specs, pipes = dict(registry._SPECS), dict(pipeline_families._PIPELINES)
    try:
        yield
    finally:
        registry._SPECS.clear()
        registry._SPECS.update(specs)
        pipeline_families._PIPELINES.clear()
        pipeline_families._PIPELINES.update(pipes)
