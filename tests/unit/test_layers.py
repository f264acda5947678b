"""The house's layering, held by a test: every import inside `lab` points down a layer (or stays inside its own
package), and no module imports itself round a circle. docs/layout.md says why each boundary is where it is.

Read from the source with `ast`, every import counted wherever it stands (a function's lazy import is still an
edge: it runs when the function does); only `if TYPE_CHECKING:` blocks are left out, since they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / "lab"

# Top to bottom. A module may import its own package and anything in a lower layer; packages that share a layer
# are independent of each other. The root modules (errors, atomic, compat, ...) are the floor.
LAYERS: list[tuple[str, ...]] = [
    ("lab.__main__",),
    ("lab.cli",),
    ("lab.commands",),
    ("lab.room",),
    ("lab.teaching", "lab.devicecheck"),
    ("lab.exercises", "lab.prediction"),
    ("lab.bench", "lab.pitfalls"),
    ("lab.sizing",),
    ("lab.training",),
    ("lab.data", "lab.observability", "lab.health"),
    ("lab.cluster",),
    ("lab.config",),
    ("lab",),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(LAB.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in LAB.rglob("*.py")}


def owner(module: str) -> tuple[int, str]:
    """(layer index, the package or root module that owns `module`) by the longest matching prefix."""
    best = None
    for index, names in enumerate(LAYERS):
        for name in names:
            if module == name or module.startswith(name + "."):
                if best is None or len(name) > len(best[1]):
                    best = (index, name)
    assert best is not None, module
    if best[1] == "lab":  # each root module is its own owner: the floor's modules may import each other
        return best[0], module
    return best


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (
        isinstance(test, ast.Name)
        and test.id == "TYPE_CHECKING"
        or isinstance(test, ast.Attribute)
        and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, here: str, is_package: bool):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from _imports(ast.Module(body=node.orelse, type_ignores=[]), here, is_package)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here.split(".") if is_package else here.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield node.lineno, full if full in MODULES else base
        yield from _imports(node, here, is_package)


def edges() -> dict[str, list[tuple[int, str]]]:
    """Each lab module's imports of lab modules: (line, the module imported)."""
    graph: dict[str, list[tuple[int, str]]] = {}
    for name, path in MODULES.items():
        found = []
        for line, target in _imports(ast.parse(path.read_text()), name, path.name == "__init__.py"):
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != name and target.split(".")[0] == "lab":
                found.append((line, target))
        graph[name] = found
    return graph


def test_every_import_points_down_a_layer_or_stays_in_its_package():
    wrong = []
    for name, targets in edges().items():
        layer, package = owner(name)
        for line, target in targets:
            target_layer, target_package = owner(target)
            if target_package == package or target_layer > layer or target == "lab":
                continue
            if LAYERS[layer] == ("lab",) and target_layer == layer:
                continue  # the floor's root modules import each other
            direction = "up" if target_layer < layer else "across"
            wrong.append(f"{MODULES[name].relative_to(LAB.parent)}:{line}: {name} imports {target} ({direction})")
    assert not wrong, "imports against the layering (tests/unit/test_layers.py LAYERS):\n" + "\n".join(wrong)


def test_no_module_imports_itself_round_a_circle():
    graph = {name: sorted({target for _, target in targets}) for name, targets in edges().items()}
    circles, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for target in graph[node]:
            if state.get(target) == "open":
                circles.append(
                    " -> ".join(trail[trail.index(target) :] + [node, target])
                    if target in trail
                    else f"{node} -> {target}"
                )
            elif target not in state:
                visit(target, trail + [node])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_ls_lab_shows_the_architecture():
    packages = sorted(p.name for p in LAB.iterdir() if (p / "__init__.py").exists())
    assert packages == [
        "bench",
        "cluster",
        "config",
        "data",
        "devicecheck",
        "exercises",
        "health",
        "observability",
        "pitfalls",
        "prediction",
        "room",
        "sizing",
        "teaching",
        "training",
    ]
    known = {name for names in LAYERS for name in names}
    for package in packages:
        assert f"lab.{package}" in known, f"lab/{package}/ has no layer in LAYERS"


def test_nothing_imports_the_command_line():
    importers = [name for name, targets in edges().items() if any(t == "lab.cli" for _, t in targets)]
    assert importers == ["lab.__main__"], f"lab.cli is imported by {importers}: only lab.__main__ may"
