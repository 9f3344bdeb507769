"""The package layout: no import circles, and each layer imports only the layers below it.

The way down is FUSE -> view -> reference sets -> cache -> fetch (fuse/, view/, refs/, cache/,
fetch/); the front doors (cli, api, dask, fstab) sit on top and `errors` at the bottom, with
`connectahead` (stdlib only: a daemon's first connection, opened before any layer is imported, which
fetch/ then takes). Every
import counts, those inside functions too: a lazy import still ties two modules together.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import refmount

PACKAGE = Path(refmount.__file__).parent
LAYERS = ["fuse", "view", "refs", "readahead", "cache", "fetch"]  # each may import only those after it
FRONT_DOORS = {"refmount", "refmount.__main__", "refmount.cli", "refmount.api", "refmount.dask", "refmount.fstab"}
SHARED = {"refmount.errors", "refmount.connectahead"}  # (the bottom: they import no layer)


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The refmount modules `name` imports (a package's submodule when the import names one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for name, imported in _graph().items():
        if name in FRONT_DOORS:
            continue
        layer = _layer(name)
        for target in imported:
            if target in SHARED or _layer(target) == layer:
                continue
            below = layer is not None and _layer(target) in LAYERS[LAYERS.index(layer) + 1:]
            if not below:
                wrong.append(f"{name} imports {target}")
    assert wrong == []


def test_the_top_level_holds_only_the_front_doors():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LAYERS)


def test_importing_every_module_leaves_refmount_mount_the_function():
    """No package may share a name with the front door's function `refmount.mount`: Python binds a
    subpackage to its parent's attribute when first imported, which would replace the function."""
    script = ("import importlib, pkgutil, refmount\n"
              "for m in pkgutil.walk_packages(refmount.__path__, 'refmount.'):\n"
              "    if m.name != 'refmount.__main__': importlib.import_module(m.name)\n"
              "print(callable(refmount.mount), refmount.mount.__module__)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "refmount"]
