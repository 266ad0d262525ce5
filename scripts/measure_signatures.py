"""Issue 37's counts: functions over 6 parameters, untyped dict parameters, ``self.s`` reads.

``python scripts/measure_signatures.py [-v] [ROOT]``: over ``controller/fleetctl/rollout/`` and
over the whole controller outside ``soak/``. A parameter is counted (self/cls not; *args and
**kwargs are); an untyped dict is a parameter named ``show`` or annotated ``dict``/``Mapping``
bare or with ``Any``/``object`` values.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _params(f: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = f.args
    named = [x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    return named + [x for x in (a.vararg, a.kwarg) if x is not None]


def _untyped(x: ast.arg) -> bool:
    s = ast.unparse(x.annotation).replace(" ", "") if x.annotation is not None else ""
    return x.arg == "show" or (s.startswith(("dict", "Mapping", "MutableMapping"))
                               and ("[" not in s or s.endswith((",Any]", ",object]"))))


def scan(paths: list[Path]) -> tuple[list[str], list[str], int]:
    """(functions over 6 parameters, untyped dict parameters, reads of ``self.s``)."""
    long, dicts, reads = [], [], 0
    for p in paths:
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                ps = _params(n)
                if len(ps) > 6:
                    long.append(f"{len(ps):2} {p}:{n.lineno} {n.name}")
                dicts += [f"{p}:{n.lineno} {n.name}({x.arg})" for x in ps if _untyped(x)]
            elif (isinstance(n, ast.Attribute) and n.attr == "s"
                  and isinstance(n.value, ast.Name) and n.value.id == "self"):
                reads += 1
    return long, dicts, reads


def main(argv: list[str]) -> None:
    args = [a for a in argv if a != "-v"]
    pkg = Path(args[0] if args else ".") / "controller" / "fleetctl"
    sets = {"rollout/": sorted(pkg.glob("rollout/**/*.py")),
            "controller outside soak/": sorted(p for p in pkg.rglob("*.py")
                                               if "soak" not in p.relative_to(pkg).parts)}
    for name, paths in sets.items():
        long, dicts, reads = scan(paths)
        print(f"{name}: {len(long)} functions over 6 parameters, {len(dicts)} untyped dict "
              f"parameters, {reads} reads of self.s")
        if "-v" in argv:
            print("\n".join(f"  {w}" for w in sorted(long, reverse=True) + dicts))


if __name__ == "__main__":
    main(sys.argv[1:])
