"""The import graph of the project's own code: no circles, and the lower packages never import the service.

Read from the sources (ast), so nothing is imported: every import counts, at module level or inside a
function, except those under `if TYPE_CHECKING:` (annotations only). A module that imports a package
depends on its `__init__`; `from package import module` depends on that module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sink_service", "uploader", "local_ems", "local_registry", "devkit")
# Packages the service builds on: none of them may import it.
BELOW_THE_SERVICE = ("uploader", "local_ems", "local_registry")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The project's modules that `name` imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(path, name, known) for name, path in known.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def _package_of(module: str) -> str:
    """sink_service.driver.pipeline -> sink_service.driver; sink_service.__main__ stays itself (the
    entry point); the other top-level packages are one node each."""
    parts = module.split(".")
    if parts[0] != "sink_service" or len(parts) == 1:
        return parts[0]
    if (ROOT / "sink_service" / parts[1]).is_dir():
        return f"sink_service.{parts[1]}"
    return module


def test_no_module_imports_itself_back():
    assert _circles(_graph()) == []


def test_no_package_imports_itself_back():
    packages: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        mine = _package_of(module)
        packages.setdefault(mine, set()).update(_package_of(t) for t in targets if _package_of(t) != mine)
    assert _circles(packages) == []


def test_the_packages_below_the_service_never_import_it():
    upward = sorted(f"{module} -> {target}" for module, targets in _graph().items()
                    if module.split(".")[0] in BELOW_THE_SERVICE
                    for target in targets if target.split(".")[0] == "sink_service")
    assert upward == []


def test_the_walk_sees_the_imports():
    # guards the test itself: a walk that finds nothing passes everything
    graph = _graph()
    assert "sink_service.config" in graph["sink_service.cli.run"]
    assert any(t.startswith("uploader.") for t in graph["sink_service.config.upload_targets"])
