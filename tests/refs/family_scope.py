"""Families a test defines, registered for the test's module only: :func:`families_restored`
snapshots the family registry (one spec per family names its pipelines too) and puts it back
on exit, so a test module's toy family is not listed in another module's messages (xdist runs
modules in any order on a worker)."""

import contextlib

from ditax.models import registry


@contextlib.contextmanager
def families_restored():
    registry.family_names()     # every built-in family, imported once, stays registered
    specs = dict(registry._SPECS)
    try:
        yield
    finally:
        registry._SPECS.clear()
        registry._SPECS.update(specs)
