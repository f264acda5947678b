"""The house's layering, held by a test: every import inside `lab` points down a layer (or stays inside its own
package), and no module imports itself round a circle. docs/layout.md says why each boundary is where it is.

Read from the source with `ast`, every import counted wherever it stands (a function's lazy import is still an
edge: it runs when the function does); only `if TYPE_CHECKING:` blocks are left out, since they never run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / "lab"

# Top to bottom: the entry, then the four wings (machine above course above measure above run), each with its own
# floors inside, then the ground. A module may import its own package and anything in a lower layer; packages that
# share a layer are independent of each other. The root modules (errors, atomic, command, verdict, ...) are the
# ground floor.
WINGS = ("lab.machine", "lab.course", "lab.measure", "lab.run")
LAYERS: list[tuple[str, ...]] = [
    ("lab.__main__",),
    ("lab.cli",),
    # machine: is this host, fabric, GPU fit; the device check runs the other wings' commands
    ("lab.machine.commands",),
    ("lab.machine.devicecheck", "lab.machine.health"),
    # course: the lessons, the exercises, the pitfalls, the room
    ("lab.course.commands",),
    ("lab.course.arguments", "lab.course.room"),
    ("lab.course.teaching",),
    ("lab.course.exercises",),
    ("lab.course.pitfalls",),
    ("lab.course.records",),
    # measure: the benchmarks, prediction, sizing, the platforms' published figures
    ("lab.measure.commands",),
    ("lab.measure.prediction",),
    ("lab.measure.bench",),
    ("lab.measure.sizing",),
    ("lab.measure.platforms",),
    # run: one training run and what it stands on
    ("lab.run.commands",),
    ("lab.run.start", "lab.run.arguments"),
    ("lab.run.training",),
    ("lab.run.data", "lab.run.observability"),
    ("lab.run.cluster",),
    ("lab.run.config",),
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


MODULE_STRING = re.compile(r"lab(?:\.\w+)+")  # a whole string that names a module (or a name in one)

# Upward references by name that the layering allows, each with why. Nothing else may name a module above it.
NAMED_UPWARD = {
    # The strategies' table is torch-free so the config can check dist.strategy before torch is imported; each row
    # names its class, which lab.run.training.strategies.build imports (a new strategy stays one row).
    ("lab.run.config", "lab.run.training"),
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings (a module's, a class's, a function's)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _strings(tree: ast.AST):
    """(line, module) for each string that is a lab module's name, or a name in one, outside a docstring:
    `python -m lab.x.y`, importlib.import_module("lab.x.y"), a "module.function" row. The module runs when the
    string is used, so it is an edge like an import (a message that mentions a module among other words is not)."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if MODULE_STRING.fullmatch(node.value.strip()):
                yield node.lineno, node.value.strip()


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


def edges(strings: bool = True) -> dict[str, list[tuple[int, str]]]:
    """Each lab module's imports of lab modules, and (with `strings`) the modules its strings name: (line, the
    module)."""
    graph: dict[str, list[tuple[int, str]]] = {}
    for name, path in MODULES.items():
        found = []
        tree = ast.parse(path.read_text())
        named = _strings(tree) if strings else ()
        for line, target in [*_imports(tree, name, path.name == "__init__.py"), *named]:
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
            if (package, target_package) in NAMED_UPWARD:
                continue
            direction = "up" if target_layer < layer else "across"
            wrong.append(f"{MODULES[name].relative_to(LAB.parent)}:{line}: {name} imports {target} ({direction})")
    assert not wrong, "imports against the layering (tests/unit/test_layers.py LAYERS):\n" + "\n".join(wrong)


def test_no_module_imports_itself_round_a_circle():
    # imports only: a module named in a string runs later or in another process (`python -m`), never mid-import
    graph = {name: sorted({target for _, target in targets}) for name, targets in edges(strings=False).items()}
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
    assert packages == ["course", "machine", "measure", "run"]
    known = {name for names in LAYERS for name in names}
    for wing in packages:
        for inner in sorted((LAB / wing).iterdir()):
            if inner.name == "__init__.py" or inner.name.startswith((".", "__")):
                continue
            name = f"lab.{wing}.{inner.stem}"
            assert name in known, f"lab/{wing}/{inner.name} has no layer in LAYERS"


def test_nothing_imports_the_command_line():
    importers = [name for name, targets in edges().items() if any(t == "lab.cli" for _, t in targets)]
    assert importers == ["lab.__main__"], f"lab.cli is imported by {importers}: only lab.__main__ may"


MODULE_LINES = 400  # a module longer than this holds more than one concept: split it by what its pieces are


def test_no_module_is_over_400_lines():
    long = {
        str(path.relative_to(LAB.parent)): n
        for path in MODULES.values()
        if (n := len(path.read_text().splitlines())) > MODULE_LINES
    }
    assert not long, f"modules over {MODULE_LINES} lines (split each by what its pieces are): {long}"
