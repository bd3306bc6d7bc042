"""The package's layers: no import cycles, no import from a higher layer, no hidden function-level imports.

Every module under ``rpwjax/`` is parsed with :mod:`ast`; every import counts, the ones inside functions too
(relative imports resolved). A *room* is a subpackage (``rpwjax.audit``) or a top-level module
(``rpwjax.keys``). The checks:

1. no cycle between modules (a package importing its own submodules, to re-export them, is no edge);
2. no cycle between rooms;
3. no import from a room in a higher layer of :data:`LAYERS`, and every room in exactly one layer;
4. a function-level import of an rpwjax module or of a dependency (the standard library aside), or an
   ``importlib.import_module`` call anywhere, only where :data:`ALLOWED_LAZY` allows it, with its reason.

The layer order is drawn in the README's development section.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

PACKAGE = "rpwjax"
ROOT = pathlib.Path(__file__).resolve().parents[1] / PACKAGE

# Rooms from low to high: a room imports only from its own layer or lower ones (and never in a cycle).
LAYERS = [
    ["rpwjax.errors", "rpwjax.interrupts", "rpwjax.pytree", "rpwjax.stream", "rpwjax.grid", "rpwjax.draws"],
    ["rpwjax.accounting"],  # one release's privacy account: every statistic and release, the rows each reads
    ["rpwjax.keys", "rpwjax.io", "rpwjax.training"],
    ["rpwjax.noise", "rpwjax.ledger", "rpwjax.tables"],
    ["rpwjax.priors"],
    ["rpwjax.mechanisms"],
    ["rpwjax.sampling"],  # steps 1-4 of a release for given uniforms, the release spec
    ["rpwjax.realized"],  # exact realized probabilities of what sampling emits
    ["rpwjax.certify"],  # the realized check every release passes first
    ["rpwjax.release_path"],
    ["rpwjax.api", "rpwjax.posterior"],
    ["rpwjax.audit"],
    ["rpwjax.release_run"],  # one command's release: its secret, its ledger line, the charge of a failed run
    ["rpwjax.privatize"],
    ["rpwjax.pipelines", "rpwjax.dask"],
    ["rpwjax.experiments"],
    ["rpwjax.bench"],
    ["rpwjax"],  # the package's lazy namespace (its targets are strings, see rpwjax/__init__.py)
    ["rpwjax.cli"],
]

# module -> (what it may import inside functions: top-level names, or None for anything; why)
ALLOWED_LAZY = {
    "rpwjax": (None, "PEP 562 __getattr__: `import rpwjax` loads nothing heavy until a name is used"),
    "rpwjax.cli": (None, "installs its signal handlers (rpwjax.interrupts) before anything heavy loads, so Ctrl-C "
                         "during the imports exits 130 and `import rpwjax.cli` loads no JAX"),
    "rpwjax.bench.cases": (("opendp", "diffprivlib"), "optional peers of the benchmark, imported when their case runs"),
}


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def parse_imports(name: str, source: str, package: bool) -> list[tuple[list[str], bool, int]]:
    """([candidate targets], function-level?, line) for every import statement of module ``name``.

    ``from m import x`` gives the candidates ``m.x`` and ``m`` (``m.x`` when it is a submodule).
    """
    base = name.split(".") if package else name.split(".")[:-1]
    found = []

    def visit(node, nested):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend(([alias.name], nested, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    up = base[: len(base) - (child.level - 1)]
                    module = ".".join(up + ([child.module] if child.module else []))
                else:
                    module = child.module
                found.extend(([f"{module}.{alias.name}", module], nested, child.lineno) for alias in child.names)
            elif isinstance(child, ast.Call) and _dynamic_import(child.func):
                found.append((["<importlib.import_module>"], True, child.lineno))  # a target only known at run time
            visit(child, nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def _dynamic_import(func) -> bool:
    """Whether a call's function is ``importlib.import_module`` (or ``import_module``) or ``__import__``."""
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name in ("import_module", "__import__")


def resolve(targets: list[str], modules: set[str]) -> str | None:
    """The first of ``targets`` that is an rpwjax module (or has one as its longest prefix), or None."""
    for target in targets:
        parts = target.split(".")
        while parts:
            if ".".join(parts) in modules:
                return ".".join(parts)
            parts.pop()
    return None


def room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def collect(root: pathlib.Path = ROOT):
    """{module: {imported rpwjax module: line}} and [(module, imported, line)] of the function-level imports
    of rpwjax modules and of dependencies (the standard library and ``__future__`` aside)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(files)
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    lazy = set()
    for m, path in files.items():
        package = path.name == "__init__.py"
        for targets, nested, line in parse_imports(m, path.read_text(), package):
            hit = resolve(targets, modules)
            top = targets[-1].split(".")[0]
            if nested and (hit is not None or top not in sys.stdlib_module_names | {"__future__"}):
                lazy.add((m, hit or targets[-1], line))
            if hit is None or hit == m:
                continue
            if package and hit.startswith(m + "."):
                continue  # a package importing its own submodules: re-export, not a dependency
            graph[m].setdefault(hit, line)
    return graph, sorted(lazy)


def find_cycle(graph: dict[str, dict]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def room_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, str]]:
    """{room: {imported room: 'module -> module' of one edge}}."""
    rooms: dict[str, dict[str, str]] = {}
    for m, targets in graph.items():
        rooms.setdefault(room(m), {})
        for t in sorted(targets):
            if room(t) != room(m):
                rooms[room(m)].setdefault(room(t), f"{m} -> {t}")
    return rooms


def layer_problems(graph, layers) -> list[str]:
    level = {}
    problems = []
    for i, rooms in enumerate(layers):
        for r in rooms:
            if r in level:
                problems.append(f"{r} is in two layers")
            level[r] = i
    rooms = room_graph(graph)
    problems += [f"{r} is in no layer of LAYERS (add it where its imports put it)"
                 for r in sorted(rooms) if r not in level]
    problems += [f"{r} in LAYERS is no room of the package" for r in sorted(level) if r not in rooms]
    for r, targets in sorted(rooms.items()):
        for t, edge in sorted(targets.items()):
            if r in level and t in level and level[t] > level[r]:
                problems.append(f"{edge}: layer {level[r]} imports from the higher layer {level[t]}")
    return problems


def describe(cycle, edges) -> str:
    return " -> ".join(cycle) + "  (" + "; ".join(f"{a} -> {b} line {edges[a][b]}" if isinstance(edges[a][b], int)
                                            else edges[a][b] for a, b in zip(cycle, cycle[1:])) + ")"


@pytest.fixture(scope="module")
def parsed():
    return collect()


def test_no_module_cycle(parsed):
    graph, _ = parsed
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between modules: " + describe(cycle, graph)


def test_no_room_cycle(parsed):
    rooms = room_graph(parsed[0])
    cycle = find_cycle(rooms)
    assert cycle is None, "import cycle between rooms: " + describe(cycle, rooms)


def test_layers(parsed):
    problems = layer_problems(parsed[0], LAYERS)
    assert not problems, "\n".join(problems)


def test_function_level_imports(parsed):
    _, lazy = parsed
    def allowed(m, target):
        names = ALLOWED_LAZY[m][0] if m in ALLOWED_LAZY else ()
        return names is None or target.split(".")[0] in names

    hidden = [f"{m} line {line}: imports {target} inside a function" for m, target, line in lazy
              if not allowed(m, target)]
    assert not hidden, "\n".join(hidden)
    unused = set(ALLOWED_LAZY) - {m for m, _, _ in lazy}
    assert not unused, f"ALLOWED_LAZY lists modules without function-level imports: {sorted(unused)}"


def test_the_checker_sees_what_it_must(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("from . import a\n")
    (pkg / "low" / "a.py").write_text("import json\n\ndef f():\n    from rpwjax import high\n    import numpy\n"
                                      "    import os, importlib\n    return importlib.import_module('x')\n")
    (pkg / "high.py").write_text("from .low.a import f\n")
    graph, lazy = collect(pkg)
    assert graph["rpwjax.low"] == {}  # re-export of its own submodule
    assert graph["rpwjax.high"] == {"rpwjax.low.a": 1}
    assert lazy == [("rpwjax.low.a", "<importlib.import_module>", 7), ("rpwjax.low.a", "numpy", 5),
                    ("rpwjax.low.a", "rpwjax.high", 4)]
    assert find_cycle(graph) == ["rpwjax.high", "rpwjax.low.a", "rpwjax.high"]
    assert find_cycle(room_graph(graph)) == ["rpwjax.high", "rpwjax.low", "rpwjax.high"]
    problems = layer_problems(graph, [["rpwjax.low"], ["rpwjax.high"]])
    assert problems == [f"{PACKAGE} is in no layer of LAYERS (add it where its imports put it)",
                        "rpwjax.low.a -> rpwjax.high: layer 0 imports from the higher layer 1"]


def test_the_readme_draws_these_layers():
    text = (ROOT.parent / "README.md").read_text()
    after = text[text.index("Layers, low to high"):].split("\n\n")[1]  # the indented drawing that follows
    drawn = [[PACKAGE if r == PACKAGE else f"{PACKAGE}.{r}" for r in group.split()]
             for group in " ".join(line.strip() for line in after.splitlines()).split("<")]
    assert drawn == LAYERS, "README.md's development section draws other layers than LAYERS"


def test_every_listed_long_test_exists():
    """tests/long_tests.txt names tests by node id: each names a test function defined in its module (a renamed
    test would otherwise silently leave the long checks for the README's command)."""
    import ast
    from conftest import long_test_ids

    root = pathlib.Path(__file__).resolve().parent
    defined = {}
    for nodeid in long_test_ids():
        path, name = nodeid.split("::", 1)
        module = root.parent / path
        assert module.is_file(), f"tests/long_tests.txt: no module {path} ({nodeid})"
        if path not in defined:
            tree = ast.parse(module.read_text(encoding="utf-8"))
            defined[path] = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert name.split("[", 1)[0] in defined[path], f"tests/long_tests.txt: no test {nodeid}"
