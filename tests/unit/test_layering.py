"""The package layering of src/paramshard (issue 31): no import cycle between packages and
no import against the declared order, lazy imports (inside functions) included.

A *unit* is a second-level name: a package with all its rooms (``paramshard.server`` is
server/core, server/storage, ...), or a module at the package root. The root modules that
import nothing but each other (errors, mode, budgets, ...) are one unit, ROOT: every layer
shares them. ``paramshard/__init__.py`` (the public API) is the unit ``paramshard``.
"""
from __future__ import annotations

import ast
import functools
import pathlib

import pytest

SOURCE = pathlib.Path(__file__).resolve().parents[2] / "src" / "paramshard"
ROOT = "<root>"

# The root modules every layer may import: they import nothing of paramshard but each other.
SHARED_ROOT = {"errors", "budgets", "limits", "mode", "json_value", "optim", "tables", "safe_files",
               "dense_sync", "events"}

# The declared order, lowest first. A unit imports only units of LOWER layers (never its own
# layer's others, never a higher one). Why each layer sits where it does:
LAYERS: list[tuple[str, set[str]]] = [
    ("what every layer shares: errors, the mode, budgets, optimizer/table configs, listener protocols",
     {ROOT}),
    ("the one table of settings", {"settings"}),
    ("a rank's contract (ClusterEnv), its logging and its CPU share, read from the settings", {"env", "log", "cpu_shares"}),
    ("pure values both ends agree on: what rooms tell each other (messages/ imports only the root), "
     "where parameters live, the update maths, a table's schema and a model's spec (specs/)",
     {"messages", "placement", "update_rules", "specs"}),
    ("the wire (no policy: it never imports client/); checkpoint files (no network); delta files "
     "(online/: what servers publish for serving replicas)",
     {"transport", "checkpoint", "online"}),
    ("one sparse table as .npz (ps.export): files, checked as checkpoint/model_archive.py checks them",
     {"export"}),
    ("the two ends of the wire and the allreduce group: a server never imports client/, launch/, "
     "data/ (what server 0 and the trainers exchange is in messages/)",
     {"server", "client", "collective"}),
    ("watching a job: records, /metrics, the report (reads servers through client/)", {"observe"}),
    ("GEO's own parts: when a trainer sends (schedule, auto k), its round records (written with observe/'s "
     "writer), its local replica's maths and its part of a checkpoint; the trainer's GEO backend uses them",
     {"geo"}),
    ("process entry: ps.init() takes a role; builds a server (server/assembly.py), registers observers",
     {"runtime"}),
    ("starting and supervising ranks: runs runtime.serve on a server rank, knows nothing of "
     "what a trainer runs (data, trainer, models)", {"launch"}),
    ("the trainer's data: readers, features, shards (DynamicShards talks to server 0 via client/)",
     {"data"}),
    ("paramshard's Trainer and its backends (reads the launcher's leave signal)", {"trainer"}),
    ("models built from a schema", {"models"}),
    ("using a trained model: serving builds the model a file names", {"inference"}),
    ("serving a model while it learns: a replica following a delta directory, its HTTP front",
     {"serving"}),
    ("the public API and the alias of its old name (paramshard.torch)", {"paramshard", "torch"}),
    ("the commands and the apps: use the public API", {"apps", "cli"}),
    ("python -m paramshard", {"__main__"}),
]

# Edges that break the order today and belong to someone else's change: (from, to) -> why.
# None left (the last, the model spec used below inference/, moved to specs/ with the schema).
KNOWN: dict[tuple[str, str], str] = {}


def unit_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "paramshard"
    return ROOT if parts[1] in SHARED_ROOT else parts[1]


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def is_module(dotted: str) -> bool:
    path = SOURCE.parent.joinpath(*dotted.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def import_statements(statements, lazy=False):
    """(statement, lazy) for every import among ``statements`` and the blocks inside them;
    lazy: inside a function. Imports are statements, so expressions are never walked."""
    for node in statements:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, lazy
            continue
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for block in ("body", "orelse", "finalbody"):
            yield from import_statements(getattr(node, block, ()), inner)
        for part in [*getattr(node, "handlers", ()), *getattr(node, "cases", ())]:      # except, match
            yield from import_statements(part.body, inner)


def imported_modules(tree: ast.Module):
    """(module, line, lazy) for every paramshard module a file imports; ``from paramshard
    import runtime`` names the module runtime, ``from paramshard import __version__`` the package."""
    for node, lazy in import_statements(tree.body):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" if is_module(f"{node.module}.{alias.name}") else node.module
                     for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "paramshard":
                yield name, node.lineno, lazy


@functools.cache
def import_graph() -> dict[tuple[str, str], list[str]]:
    """(from unit, to unit) -> where: 'module:line' of each import between two units."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        module = module_name(path)
        for target, line, lazy in imported_modules(ast.parse(path.read_text(), str(path))):
            pair = (unit_of(module), unit_of(target))
            if pair[0] != pair[1]:
                edges.setdefault(pair, []).append(f"{module}:{line}{' (lazy)' if lazy else ''} -> {target}")
    return edges


def layer_of() -> dict[str, int]:
    return {unit: index for index, (_, units) in enumerate(LAYERS) for unit in units}


def test_every_unit_has_a_layer():
    layers = layer_of()
    units = {unit_of(module_name(p)) for p in SOURCE.rglob("*.py")}
    assert units - set(layers) == set(), "new package or root module: give it a layer in LAYERS"
    assert sum(len(units) for _, units in LAYERS) == len(layers), "a unit is in two layers"


def test_shared_root_modules_import_only_each_other():
    for name in SHARED_ROOT:
        path = SOURCE / f"{name}.py"
        assert path.is_file(), f"SHARED_ROOT names {name}, which is no module at the package root"
        for target, line, _ in imported_modules(ast.parse(path.read_text())):
            assert unit_of(target) == ROOT, f"paramshard/{name}.py:{line} imports {target}: not a shared root module"


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_packages():
    edges = {pair: where for pair, where in import_graph().items() if pair not in KNOWN}
    found = cycles(edges)
    assert not found, "import cycles between packages:\n" + "\n".join(
        " <-> ".join(c) + "\n  " + "\n  ".join(w for pair in edges if set(pair) <= set(c) for w in edges[pair][:3])
        for c in found)


def test_no_import_against_the_order():
    layers = layer_of()
    wrong = [f"{a} (layer {layers[a]}) imports {b} (layer {layers[b]}): " + "; ".join(where[:3])
             for (a, b), where in sorted(import_graph().items())
             if (a, b) not in KNOWN and a in layers and b in layers and layers[a] <= layers[b]]
    assert not wrong, "imports against LAYERS (lower layers only):\n" + "\n".join(wrong)


def test_known_exceptions_still_exist():
    """An exception that is gone leaves KNOWN, so it cannot come back unnoticed."""
    edges = import_graph()
    assert [pair for pair in KNOWN if pair not in edges] == []


@pytest.mark.parametrize("sample, expected", [
    ("def f():\n    from paramshard.client.recovery import install\n",
     [("paramshard.client.recovery", True)]),
    ("class C:\n    def f(self):\n        try:\n            pass\n        except ImportError:\n"
     "            if True:\n                import paramshard.data\n",
     [("paramshard.data", True)]),
    ("try:\n    import paramshard.log\nfinally:\n    pass\n", [("paramshard.log", False)]),
    ("from paramshard import runtime, __version__\nimport paramshard.server.core.api\n",
     [("paramshard.runtime", False), ("paramshard", False), ("paramshard.server.core.api", False)]),
])
def test_imports_are_read_inside_functions_too(sample, expected):
    assert [(m, lazy) for m, _, lazy in imported_modules(ast.parse(sample))] == expected
