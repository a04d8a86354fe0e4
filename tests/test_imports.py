"""The package's import rules, read from every import statement (function-level ones
included) by grimp (:mod:`import_graph`): no cycle between packages or between files; models/
imports none of the floors above it (config/, pipelines/, train/, cli/, plan/); for every
built-in family F, nothing outside its own folders (``ditax.{models,pipelines,train}.F``), the
demo, its recipes and the top-level ``ditax`` imports them; the shared rooms of models/
(``common/``, ``encoders/``, ``vae/``) import no family.

``python tests/import_graph.py`` prints the same findings for a person."""

import subprocess
import sys

import pytest

grimp = pytest.importorskip("grimp")

import import_graph as G  # noqa: E402  (tests/import_graph.py)


@pytest.fixture(scope="module")
def edges():
    return G.build()


def test_the_graph_sees_function_level_imports(edges):
    # ditax.cli.generate imports the pipeline only inside its functions (a light CLI start)
    assert any(t.startswith("ditax.pipelines") for t in edges["ditax.cli.generate"])
    assert "ditax.errors" in edges["ditax.config.loader"]


def test_no_cycle_between_packages(edges):
    assert G.cycles(G.package_edges(edges)) == []


def test_no_cycle_between_files(edges):
    assert G.cycles(G.file_edges(edges)) == []


def test_models_never_import_the_floors_above(edges):
    assert G.models_upward(edges) == []


def test_the_family_rule_covers_every_built_in_family():
    assert {"wan", "flux"} <= set(G.builtin_families())
    assert G.family_folders("flux") == ("ditax.models.flux", "ditax.pipelines.flux",
                                        "ditax.train.flux")


def test_only_a_familys_own_folders_import_it(edges):
    # the known open seams are listed by name; anything else, or a seam that has been closed
    # but is still listed, fails
    assert set(G.family_importers(edges)) == G.OPEN_SEAMS


def test_the_family_rule_finds_an_import_from_outside():
    edges = {"ditax.cli.x": {"ditax.pipelines.flux.loading"},       # outside: found
             "ditax.models.wan.family": {"ditax.models.flux.config"},  # another family: found
             "ditax.pipelines.flux.load": {"ditax.models.flux.config"},  # its own: fine
             "ditax.recipes.flux_parts": {"ditax.models.flux.config"},   # a guest: fine
             "ditax": {"ditax.pipelines.flux.text_to_image"},            # public surface: fine
             "ditax.models.vae.kl.model": {"ditax.models.flux.config"}}  # a shared room: found
    assert G.family_importers(edges, families=("flux", "wan")) == [
        ("ditax.cli.x", "ditax.pipelines.flux.loading"),
        ("ditax.models.vae.kl.model", "ditax.models.flux.config"),
        ("ditax.models.wan.family", "ditax.models.flux.config")]
    assert G.shared_rooms_importing_families(edges, families=("flux",)) == [
        ("ditax.models.vae.kl.model", "ditax.models.flux.config")]


def test_shared_rooms_import_no_family(edges):
    rooms = [m for m in edges if G._within(m, G.SHARED_ROOMS)]
    assert any(m.startswith("ditax.models.encoders.") for m in rooms)
    assert any(m.startswith("ditax.models.vae.wan.") for m in rooms)
    assert G.shared_rooms_importing_families(edges) == []


def test_cycle_finder_finds_cycles():
    assert G.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert G.cycles({"a": {"b"}, "b": set()}) == []


def test_shared_rooms_are_light_and_discovery_skips_them():
    # family discovery walks ditax.models' subpackages: the shared rooms' packages start no JAX
    # and register no family
    code = ("import sys; from ditax.models import registry; "
            "import ditax.models.common, ditax.models.encoders, ditax.models.vae; "
            "names = registry.family_names(); "
            "assert not set(names) & set(registry.SHARED_ROOMS), names; "
            "assert 'jax' not in sys.modules and 'flax' not in sys.modules")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
