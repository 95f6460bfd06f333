"""The import graph of the package: rooms import only rooms below them, no cycle,
imports at module top (docs/DESIGN.md, "Layers")."""

from __future__ import annotations

import ast
import pathlib

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "mucudnn"

#: Room -> level. A module may import rooms of a lower level only (and its own room).
LEVELS = {
    "errors": 0, "_version": 0,
    "units": 1, "caches": 1, "_optional": 1, "typing_aliases": 1,
    "dtypes": 2,
    "problem": 3,
    "networks": 4, "cuda": 4,
    "_cudnn": 5,
    "backends": 6,
    "optimizer": 7, "exec": 7,
    "api": 8, "plans_io": 8,
    "torch": 9,
    "bench": 10, "plot": 11, "__main__": 12, "__init__": 13,
}
#: Third-party packages that may be imported inside functions: optional extras,
#: cuda-bindings, which `import mucudnn` must not need (no GPU, no driver), and
#: the dependencies a converted model's process need not load (Note [heavy
#: imports where they are used] in mucudnn/__init__.py).
LAZY_OK = {"torch", "cupy", "jax", "jaxlib", "matplotlib", "ml_dtypes", "cuda", "torchvision",
           "scipy", "networkx", "tqdm"}
#: Rooms that no room imports, which may import lower rooms inside functions: the
#: command line loads what each command runs (Note [commands load what they run]).
#: Nothing can import them back, so this cannot make a cycle.
LAZY_ROOMS_OK = {"__main__"}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        pkg = module.split(".") if is_pkg else module.split(".")[:-1]
        pkg = pkg[:len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    names = []
    for a in node.names:
        full = f"{base}.{a.name}"
        names.append(full if full in MODULES else base)
    return names


def _imports(module: str, path: pathlib.Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(modules imported at module level, (module, line) imported inside functions)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    top: list[str] = []
    nested: list[tuple[str, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda))
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                names = _resolve(module, is_pkg, child)
            else:
                visit(child, inside)
                continue
            for n in names:
                (nested.append((n, child.lineno)) if in_function else top.append(n))
    visit(tree, False)
    return top, nested


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "mucudnn":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_room_has_a_level():
    rooms = {_room(m) for m in MODULES}
    assert rooms <= set(LEVELS), f"rooms without a level in this test: {rooms - set(LEVELS)}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_rooms_below(module):
    src = _room(module)
    bad = []
    for target in GRAPH[module][0] + [n for n, _ in GRAPH[module][1]]:
        dst = _room(target)
        if dst is None or dst == src:
            continue
        if LEVELS[dst] >= LEVELS[src]:
            bad.append(f"{module} -> {target} ({src} level {LEVELS[src]}, {dst} level "
                       f"{LEVELS[dst]})")
    assert not bad, "imports of rooms at the same or a higher level:\n" + "\n".join(bad)


def test_exec_never_imports_the_optimizer():
    for module, (top, nested) in GRAPH.items():
        if _room(module) == "exec":
            assert not [t for t in top + [n for n, _ in nested] if _room(t) == "optimizer"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_at_module_top(module):
    bad = [(n, line) for n, line in GRAPH[module][1]
           if n.split(".")[0] not in LAZY_OK
           and not (_room(module) in LAZY_ROOMS_OK and _room(n) is not None)]
    assert not bad, f"{module}: imports inside functions: {bad}"


def test_rooms_that_import_lazily_are_imported_by_none():
    for module, (top, nested) in GRAPH.items():
        for target in top + [n for n, _ in nested]:
            assert _room(target) not in LAZY_ROOMS_OK or _room(module) == _room(target), \
                f"{module} imports {target}"


def test_no_import_cycle():
    g = nx.DiGraph()
    for module, (top, _) in GRAPH.items():
        for target in top:
            if target in MODULES and target != module:
                # a package's __init__ importing its own submodules is not a cycle risk
                if module != "mucudnn" and target.startswith(module + "."):
                    continue
                g.add_edge(module, target)
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles: {cycles[:5]}"
