"""Import layering of verl's modules: no import cycle through the modules whose layers were fixed, and the workers'
config never imports the trainer (the trainer's config is built on top of it).

The graph is read from the source (``ast``), imports inside functions included: a lazy import that closes a
circle is still a circle, it only moves the failure from import time to call time. Imports under
``if TYPE_CHECKING:`` are left out: they never run and only name types for annotations.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "verl"

# modules (or package prefixes, ending in ".") that must sit on no import cycle
ACYCLIC = (
    "verl.protocol",
    "verl._protocol_utils",
    "verl._protocol_future",
    "verl.base_config",
    "verl.workers.config.",
    "verl.trainer.config.",
    "verl.utils.fsdp_utils",
    "verl.utils.fsdp_internals",
    "verl.utils.platform.base",
    "verl.utils.platform.registry",
    "verl.utils.platform.cpu",
    "verl.utils.platform.cuda",
    "verl.utils.platform.npu",
    "verl.utils.platform.cann",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Every dotted name imported anywhere in ``tree`` (``from a import b`` gives ``a`` and ``a.b``)."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """``{module: modules it imports}`` restricted to ``sources`` (``{module: (source text, is_package)}``)."""
    graph: dict[str, set[str]] = {}
    for module, (text, is_package) in sources.items():
        targets = {name for name in _imported_names(ast.parse(text), module, is_package) if name in sources}
        graph[module] = targets - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _verl_sources() -> dict[str, tuple[str, bool]]:
    return {
        _module_name(path): (path.read_text(encoding="utf-8"), path.name == "__init__.py")
        for path in PACKAGE.rglob("*.py")
    }


def _checked(module: str) -> bool:
    return any(module.startswith(p) if p.endswith(".") else module == p for p in ACYCLIC)


def test_no_import_cycle_through_layered_modules():
    """No cycle of imports passes through the protocol, config, FSDP-adapter or platform modules."""
    bad = [sorted(c) for c in cycles(import_graph(_verl_sources())) if any(_checked(m) for m in c)]
    assert not bad, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in bad)


def test_workers_config_does_not_import_the_trainer():
    """verl.workers.config is the lower layer: it imports nothing from verl.trainer (the trainer's config imports
    it; shared pieces live in verl.workers.config.common and are re-exported by verl.trainer.config)."""
    sources = _verl_sources()
    upward = [
        f"{module} imports {name}"
        for module, (text, is_package) in sources.items()
        if module.startswith("verl.workers.config")
        for name in _imported_names(ast.parse(text), module, is_package)
        if name == "verl.trainer" or name.startswith("verl.trainer.")
    ]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize(
    "files, expected",
    [
        # a lazy import inside a function still closes the circle
        ({"p.a": "import p.b", "p.b": "def f():\n    from p.a import x"}, [{"p.a", "p.b"}]),
        # `from p import b` where b is a module, and a relative import
        ({"p": "from p import b", "p.b": "from . import c", "p.c": "import p"}, [{"p", "p.b", "p.c"}]),
        # one-way imports and TYPE_CHECKING-only back references are no cycle
        ({"p.a": "import p.b", "p.b": "import p.c", "p.c": "x = 1"}, []),
        ({"p.a": "import p.b", "p.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.a"}, []),
    ],
)
def test_cycle_detector(files, expected):
    """The graph reader and the cycle finder on hand-written module sets (self-test of this lint)."""
    sources = {name: (text, name == "p") for name, text in files.items()}
    assert cycles(import_graph(sources)) == expected
