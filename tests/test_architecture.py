"""The package's import direction (docs/architecture.md), read from the source: every import, function-level ones
included, goes from a higher layer to a lower one or stays inside its own concern, and no modules import each other
in a cycle. A new module must be given a layer here, which is the point: where it sits is a decision."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fastfeed"

# Lowest first. A concern may import its own modules and any concern of a lower layer, never one of its own layer or
# above.
LAYERS = [
    ["fastfeed.urls"],
    ["fastfeed._native", "fastfeed.constants", "fastfeed.types", "fastfeed.world", "fastfeed.rle"],
    ["fastfeed.sampling", "fastfeed.image", "fastfeed.targets"],
    ["fastfeed.formats"],
    ["fastfeed.remote"],
    ["fastfeed.datasets", "fastfeed.tuning"],
    ["fastfeed.decode"],
    ["fastfeed.detect"],
    ["fastfeed.loader"],
    ["fastfeed.pack", "fastfeed.demo_data", "fastfeed.doctor"],
    ["fastfeed.bench"],
    ["fastfeed.profile"],
    ["fastfeed.commands", "fastfeed.cli"],
    ["fastfeed"],  # the package's own __init__: the public names, loaded lazily
]
RANK = {concern: i for i, layer in enumerate(LAYERS) for concern in layer}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every fastfeed module `path` imports, at any depth of its code."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:  # `from base import a`: the module base.a where it is one, else base itself
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return {m for m in out if m in MODULES}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")} | {"fastfeed._native": None}
GRAPH = {m: imports(p) - {m} for m, p in MODULES.items() if p is not None}


def concern(module: str) -> str:
    """The deepest entry of LAYERS that `module` is, or lies in."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANK:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} has no layer in tests/test_architecture.py LAYERS: give it one")


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_go_down_the_layers(module):
    mine = concern(module)
    wrong = [f"{dep} ({concern(dep)}, layer {RANK[concern(dep)]})" for dep in sorted(GRAPH[module])
             if concern(dep) != mine and RANK[concern(dep)] >= RANK[mine]]
    assert not wrong, f"{module} ({mine}, layer {RANK[mine]}) imports {', '.join(wrong)}"


def test_no_import_cycle():
    """Tarjan's strongly connected components over the module graph: every one must be a single module."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_function_level_imports(tmp_path):
    """The graph would miss the cycles this test exists for if it read only the top of each file."""
    src = tmp_path / "fastfeed" / "m.py"
    src.parent.mkdir()
    src.write_text("def f():\n    from fastfeed.loader import epoch\n")
    global PACKAGE
    saved = PACKAGE
    PACKAGE = tmp_path / "fastfeed"
    try:
        assert imports(src) == {"fastfeed.loader.epoch"}
    finally:
        PACKAGE = saved
