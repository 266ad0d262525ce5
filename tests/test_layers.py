"""The package's arrows point one way: each part imports only parts below it (cli -> verbs -> core).

Every import of one top-level part of ``fleetctl`` by another is read from the source with ``ast`` and
checked against the layers below; a new part must be given its layer here, which is the point: the
place of each concept is a decision, not an accident.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "controller" / "fleetctl"

#: Lower layers first. A part may import parts of lower layers only (not of its own layer).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "errors"),  # "" is fleetctl/__init__ (the version)
    ("paths", "progress", "durations", "runids", "access", "allreduce_probe", "container"),
    ("inventory", "secretenv", "registry", "facts"),
    ("recipes", "ssh", "fabric", "frontdoor"),
    ("ansible", "state", "lab", "serving", "bandwidth", "warmcache"),
    ("soak", "provision", "stage", "status"),
    ("rollout",),
    ("cli",),
)
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _part(module: str) -> str:
    """``fleetctl.rollout.host`` -> ``rollout``; ``fleetctl`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``fleetctl`` import in the file, ``from fleetctl import x`` as ``fleetctl.x``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fleetctl":
                out += [(node.lineno, f"fleetctl.{a.name}") for a in node.names]
            elif node.module.startswith("fleetctl."):
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "fleetctl"]
    return out


def _modules() -> list[tuple[Path, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out.append((path, ".".join(parts)))
    return out


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
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {module} imports {imported} "
                             f"({me!r} is layer {RANK[me]}, {it!r} layer {RANK[it]})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from fleetctl.rollout import host\nfrom fleetctl import cli\nimport fleetctl.state.ledger\n")
    assert [m for _, m in _imports(bad)] == ["fleetctl.rollout", "fleetctl.cli", "fleetctl.state.ledger"]
    assert RANK[_part("fleetctl.rollout.host")] > RANK[_part("fleetctl.soak.run")]
