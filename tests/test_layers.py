"""The layers hold (docs/architecture.md, "Layers, and folders by question"): every `gpuwise` import,
at the top of a module or inside a function, goes downward
(cli -> report -> app -> measure -> estimate -> workload -> catalog -> errors/units); no
import cycle hides behind in-function imports; no module imports another's private name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gpuwise"
ORDER = ("base", "catalog", "workload", "estimate", "measure", "app", "report", "cli")
BASE = ("errors", "files", "units")
# Started as files in the user's process by `gpuwise watch`: private by name, not by layer.
INJECTED = "gpuwise.measure.watch.inject"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """The layer a module is in; 'top' for the package itself (the public API's re-exports)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "top"
    return "base" if parts[1] in BASE else parts[1]


def imports(root: Path) -> list[tuple[str, str, list[str], int]]:
    """(importer, imported module, names, line) for every gpuwise import under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        importer = module_name(path, root)
        if importer.startswith(INJECTED):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] == root.name:
                    found.append((importer, node.module, [a.name for a in node.names],
                                  node.lineno))
            elif isinstance(node, ast.Import):
                found += [(importer, a.name, [], node.lineno) for a in node.names
                          if a.name.split(".")[0] == root.name]
    return found


def upward(edges: list[tuple[str, str, list[str], int]]) -> list[str]:
    rank = {name: i for i, name in enumerate(ORDER)}
    bad = []
    for importer, target, _, line in edges:
        src, dst = layer(importer), layer(target)
        if src == "top":
            continue
        if dst == "top" or src not in rank or dst not in rank or rank[dst] > rank[src]:
            bad.append(f"{importer}:{line} ({src}) imports {target} ({dst})")
    return bad


def private_names(edges: list[tuple[str, str, list[str], int]], modules: set[str]) -> list[str]:
    """A private name taken from another module (a submodule named `_x` is a module, not a name)."""
    return [f"{importer}:{line} imports {name} from {target}"
            for importer, target, names, line in edges
            for name in names
            if name.startswith("_") and not name.startswith("__")
            and f"{target}.{name}" not in modules and target != importer]


def cycles(edges: list[tuple[str, str, list[str], int]], modules: set[str]) -> list[list[str]]:
    """Import cycles between modules (a name imported from a package counts as the package's;
    `from package import submodule` as the submodule's)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for importer, target, names, _ in edges:
        for name in names or [""]:
            sub = f"{target}.{name}"
            dst = sub if sub in modules else target
            if dst in modules and dst != importer:
                graph[importer].add(dst)
    found, state = [], dict.fromkeys(graph, 0)
    for start in sorted(graph):
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        while stack and not state[start]:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    found.append(path + [start])
                elif nxt not in path and not state[nxt]:
                    stack.append((nxt, path + [nxt]))
        state[start] = 1
    return found


def _checked(root: Path) -> tuple[list[str], list[str], list[list[str]]]:
    edges = imports(root)
    modules = {module_name(p, root) for p in root.rglob("*.py")}
    return upward(edges), private_names(edges, modules), cycles(edges, modules)


def test_every_gpuwise_import_goes_downward_without_cycles_or_private_names():
    up, private, loops = _checked(PACKAGE)
    assert up == [], "upward imports:\n" + "\n".join(up)
    assert private == [], "private names imported across modules:\n" + "\n".join(private)
    assert loops == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in loops[:10])


@pytest.fixture
def bad_tree(tmp_path: Path) -> Path:
    root = tmp_path / "gpuwise"
    for folder in ("catalog", "estimate", "report"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "catalog" / "a.py").write_text("def f():\n    from gpuwise.estimate.b import g\n")
    (root / "estimate" / "b.py").write_text("from gpuwise.catalog.a import _hidden\n"
                                            "from gpuwise.estimate import c\n")
    (root / "estimate" / "c.py").write_text("def h():\n    from gpuwise.estimate.b import g\n")
    (root / "report" / "d.py").write_text("from gpuwise.estimate.b import g\n")
    return root


def test_the_checks_find_an_upward_import_a_private_name_and_a_hidden_cycle(bad_tree: Path):
    up, private, loops = _checked(bad_tree)
    assert up == ["gpuwise.catalog.a:2 (catalog) imports gpuwise.estimate.b (estimate)"]
    assert private == ["gpuwise.estimate.b:1 imports _hidden from gpuwise.catalog.a"]
    assert any(set(c) == {"gpuwise.estimate.b", "gpuwise.estimate.c"} for c in loops)
    assert all("gpuwise.report.d" not in c for c in loops)  # report -> estimate is allowed
