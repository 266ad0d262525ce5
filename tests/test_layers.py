"""The package's arrows point one way: each part imports only parts below it (cli -> verbs ->
core), and no modules import each other in a circle, inside a part either.

Every import of one top-level part of ``fleetctl`` by another is read from the source with ``ast``
and checked against the layers below; a new part must be given its layer here, which is the point:
the place of each concept is a decision, not an accident.

Inside a part the modules have no layers written down, but their imports must not run in a circle
(``cli/live.py -> cli/ui.py -> cli/live.py``): every import of one module of the package by another
counts, at the top of the file, inside a function (an import deferred to call time still ties the
two: neither can be read, tested or moved without the other; deferring only hides the circle from
Python's loader) or under ``if TYPE_CHECKING``. One kind of arrow is left out: a package's
``__init__`` importing a module inside that package (``frontdoor/__init__.py`` picking a backend in
``frontdoor/haproxy.py``), because Python runs a package's ``__init__`` before any of its modules
anyway: the package and its modules load as one, and the modules' own imports are still checked.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "controller" / "fleetctl"

#: Lower layers first. A part may import parts of lower layers only (not of its own layer).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "errors"),  # "" is fleetctl/__init__ (the version)
    ("paths", "progress", "durations", "runids", "access", "allreduce_probe", "container", "urls",
     "httpbound"),
    ("inventory", "secretenv", "registry", "facts"),
    ("recipes", "ssh", "fabric", "frontdoor"),
    ("ansible", "state", "lab", "serving", "bandwidth", "warmcache"),
    ("soak", "provision", "stage", "status"),
    ("rollout", "stage_fleet"),
    ("remediate",),
    ("cli",),
)
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _part(module: str) -> str:
    """``fleetctl.rollout.host`` -> ``rollout``; ``fleetctl`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``fleetctl`` import in the file, ``from fleetctl import x`` as
    ``fleetctl.x``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fleetctl":
                out += [(node.lineno, f"fleetctl.{a.name}") for a in node.names]
            elif node.module.startswith("fleetctl."):
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "fleetctl"]
    return out


def _modules(package: Path = PACKAGE) -> list[tuple[Path, str]]:
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out.append((path, ".".join(parts)))
    return out


def _module_graph(package: Path = PACKAGE) -> dict[str, dict[str, tuple[Path, int]]]:
    """module -> {module it imports: (file, line of the first such import)}, for the modules of
    ``package``.

    ``from a.b import c`` is an arrow to ``a.b.c`` when that is a module, else to ``a.b``; relative
    imports are resolved; arrows from a package's ``__init__`` to modules inside it are left out
    (module docstring).
    """
    modules = {name: path for path, name in _modules(package)}
    graph: dict[str, dict[str, tuple[Path, int]]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        out = graph[name] = {}
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            for target in targets:
                if target not in modules or target == name:
                    continue
                if is_package and target.startswith(name + "."):
                    continue  # a package's face importing its own modules: they load as one
                out.setdefault(target, (path, node.lineno))
    return graph


def _circles(graph: dict[str, dict[str, tuple[Path, int]]]) -> list[list[str]]:
    """The modules that import each other in a loop: each strongly connected set of two or more,
    sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _explain(graph: dict[str, dict[str, tuple[Path, int]]], circle: list[str], root: Path) -> str:
    """The arrows that tie one circle, each with the file and line of its import."""
    inside = set(circle)
    lines = [f"  {path.relative_to(root)}:{line}: {a} imports {b}"
             for a in circle for b, (path, line) in sorted(graph[a].items()) if b in inside]
    return " -> ".join(m.removeprefix("fleetctl.") for m in circle) + "\n" + "\n".join(lines)


def test_no_import_circles() -> None:
    graph = _module_graph()
    circles = _circles(graph)
    assert not circles, (
        "modules of fleetctl that import each other in a circle (an import inside a function "
        "counts; move what both need into a module below them):\n"
        + "\n".join(_explain(graph, c, PACKAGE.parent) for c in circles)
    )


def test_the_checker_sees_a_circle_inside_a_part(tmp_path: Path) -> None:
    pkg = tmp_path / "fleetctl"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "door").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "cli" / "live.py").write_text("def serve():\n    from fleetctl.cli import ui\n")
    (pkg / "cli" / "ui.py").write_text("from fleetctl.cli.table import rows\n")
    (pkg / "cli" / "table.py").write_text("from . import live\n")
    (pkg / "cli" / "alone.py").write_text("from fleetctl.cli import ui\n")
    # a package's face picking its backend: no circle (Python loads the two as one)
    (pkg / "door" / "__init__.py").write_text(
        "def build():\n    from fleetctl.door import haproxy\n"
    )
    (pkg / "door" / "haproxy.py").write_text("from fleetctl.door import build\n")
    graph = _module_graph(pkg)
    assert graph["fleetctl.cli.live"] == {"fleetctl.cli.ui": (pkg / "cli" / "live.py", 2)}
    assert _circles(graph) == [["fleetctl.cli.live", "fleetctl.cli.table", "fleetctl.cli.ui"]]
    assert "cli/live.py:2: fleetctl.cli.live imports fleetctl.cli.ui" in _explain(
        graph, _circles(graph)[0], tmp_path
    )


def test_every_part_has_a_layer() -> None:
    unknown = sorted({_part(m) for _, m in _modules()} - RANK.keys())
    assert not unknown, f"give these parts of fleetctl a layer in tests/test_layers.py: {unknown}"


def test_imports_point_down_the_layers() -> None:
    wrong: list[str] = []
    for path, module in _modules():
        me = _part(module)
        for line, imported in _imports(path):
            it = _part(imported)
            if it == me or it not in RANK or me not in RANK:
                continue
            if RANK[it] >= RANK[me]:
                wrong.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line}: {module} imports {imported} "
                    f"({me!r} is layer {RANK[me]}, {it!r} layer {RANK[it]})"
                )
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from fleetctl.rollout import host\nfrom fleetctl import cli\nimport "
        "fleetctl.state.ledger\n"
    )
    assert [m for _, m in _imports(bad)] == [
        "fleetctl.rollout",
        "fleetctl.cli",
        "fleetctl.state.ledger",
    ]
    assert RANK[_part("fleetctl.rollout.host")] > RANK[_part("fleetctl.soak.run")]
