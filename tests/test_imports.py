"""The package's import rules, read from every import statement (function-level ones
included) by grimp (:mod:`import_graph`): no cycle between packages or between files; models/
imports none of the floors above it (config/, pipelines/, train/, cli/, plan/); nothing outside
Wan's own folders, the demo and its recipe imports ``ditax.models.wan``.

``python tests/import_graph.py`` prints the same findings for a person."""

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


def test_only_wans_own_folders_import_wan(edges):
    assert G.wan_importers(edges) == []


def test_cycle_finder_finds_cycles():
    assert G.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert G.cycles({"a": {"b"}, "b": set()}) == []
