"""ditax's import graph (every ``import`` statement, function-level ones included, read by
grimp) and the rules the package keeps: no cycle between packages (``ditax.X``) or between
files, models/ importing none of the floors above it, every built-in family reached only from
its own folders, and the shared rooms of models/ importing no family.

``python tests/import_graph.py`` prints what breaks a rule (nothing when all hold);
``tests/test_imports.py`` asserts each rule.
"""

from __future__ import annotations

import collections
import sys

import grimp

from ditax.models import registry

# where a family F's code lives: ditax.models.F, ditax.pipelines.F, ditax.train.F
FAMILY_FLOORS = ("ditax.models", "ditax.pipelines", "ditax.train")
# besides its own folders, what may import a family: the demo and its recipes (packages), and
# the top-level ``ditax`` itself (the curated public surface re-exports a family's pipelines;
# the module only, not every ``ditax.*``)
FAMILY_GUESTS = ("ditax.demo", "ditax.recipes")
PUBLIC_SURFACE = "ditax"
# edges into a family from outside its folders that are known and still open (each is a seam a
# later change closes by moving the code into the family's folders); the test asserts that the
# graph holds exactly these, so a new one fails and a closed one must be struck from the list
OPEN_SEAMS: set = set()    # named exceptions to the rule (none: each family's flags are its own)
# the shared rooms of models/ (building floor, encoders, VAEs): any family may import them,
# they import no family
SHARED_ROOMS = tuple(f"ditax.models.{room}" for room in registry.SHARED_ROOMS)
# packages models/ stands below: a model never imports them (lora/ is machinery below the
# families: it takes their name maps, and a family's loader may call it)
ABOVE_MODELS = ("ditax.config", "ditax.pipelines", "ditax.train", "ditax.cli", "ditax.plan",
                "ditax.serve", "ditax.recipes", "ditax.demo", "ditax.bench")


def builtin_families() -> list[str]:
    """Names of the families ditax ships (a subpackage of ``ditax.models`` each; families
    outside ditax have dotted names and are not part of this graph)."""
    return [f for f in registry.family_names() if "." not in f]


def family_folders(family: str) -> tuple[str, ...]:
    """The packages that are ``family``'s own: ``ditax.{models,pipelines,train}.<family>``."""
    return tuple(f"{floor}.{family}" for floor in FAMILY_FLOORS)


def build():
    """``{module: set of ditax modules it imports}`` for every module of the package."""
    g = grimp.build_graph("ditax", cache_dir=None)
    return {m: {t for t in g.find_modules_directly_imported_by(m) if t != m} for m in g.modules}


def package(module: str) -> str:
    """``ditax.X`` of a module (the top-level ``ditax`` stays itself)."""
    return ".".join(module.split(".")[:2])


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = n; n += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n; n += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def package_edges(edges):
    pk = collections.defaultdict(set)
    for m, targets in edges.items():
        for t in targets:
            # the top-level ``ditax`` (lazy public names) stands above everything: its own edges
            # into the package do not make cycles with the modules that import ``ditax.errors``
            if package(m) != package(t) and t != "ditax":
                pk[package(m)].add(package(t))
    return pk


def file_edges(edges):
    """Module edges without the package ``__init__`` re-export edges of a package into its
    own files (``ditax.x`` → ``ditax.x.y`` is the package exposing its parts, not a use)."""
    return {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in edges.items()}


def family_importers(edges, families=None) -> list[tuple[str, str]]:
    """``(importer, imported)`` edges into a family's folders from outside them (its own
    folders, the demo, the recipes and the top-level ``ditax`` may import it; the
    :data:`OPEN_SEAMS` included); ``families``: the built-in ones."""
    found = []
    for family in builtin_families() if families is None else families:
        own = family_folders(family)
        found += [(m, t) for m, ts in edges.items() for t in ts
                  if _within(t, own) and m != PUBLIC_SURFACE
                  and not _within(m, own + FAMILY_GUESTS)]
    return sorted(found)


def shared_rooms_importing_families(edges, families=None) -> list[tuple[str, str]]:
    """``(importer, imported)`` edges from a shared room of models/ (``common``, ``encoders``,
    ``vae``) into any family's folders."""
    homes = [p for f in (builtin_families() if families is None else families)
             for p in family_folders(f)]
    return sorted((m, t) for m, ts in edges.items() for t in ts
                  if _within(m, SHARED_ROOMS) and _within(t, homes))


def models_upward(edges) -> list[tuple[str, str]]:
    return sorted((m, t) for m, ts in edges.items() for t in ts
                  if _within(m, ("ditax.models",)) and _within(t, ABOVE_MODELS))


def main() -> int:
    edges = build()
    problems = 0
    for c in cycles(package_edges(edges)):
        print("package cycle:", " ↔ ".join(c)); problems += 1
    for c in cycles(file_edges(edges)):
        print("file cycle:", " ↔ ".join(c)); problems += 1
    for m, t in family_importers(edges):
        if (m, t) in OPEN_SEAMS:
            print(f"(known open seam) {m} → {t}")
        else:
            print(f"imports a family from outside its folders: {m} → {t}"); problems += 1
    for m, t in sorted(OPEN_SEAMS - set(family_importers(edges))):
        print(f"open seam closed, strike it from OPEN_SEAMS: {m} → {t}"); problems += 1
    for m, t in shared_rooms_importing_families(edges):
        print(f"a shared room of models/ imports a family: {m} → {t}"); problems += 1
    for m, t in models_upward(edges):
        print(f"models/ imports a floor above it: {m} → {t}"); problems += 1
    print(f"{problems} problem(s) in {len(edges)} modules")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
