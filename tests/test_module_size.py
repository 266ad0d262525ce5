"""The house stays readable: no module of the controller, and no module the roles ship, over 650
lines (a file that grows past it is split by concept: see docs/design.md's Layout)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 650


def oversized(paths: list[Path], limit: int = LIMIT) -> list[str]:
    """``path: N lines`` for each file of ``paths`` over ``limit`` lines."""
    out = []
    for p in paths:
        n = len(p.read_text().splitlines())
        if n > limit:
            out.append(f"{p.relative_to(ROOT)}: {n} lines")
    return out


def test_no_module_is_over_the_limit() -> None:
    files = sorted((ROOT / "controller" / "fleetctl").rglob("*.py"))
    files += sorted((ROOT / "roles").rglob("*.py"))
    assert files
    assert oversized(files) == []


def test_the_check_sees_a_module_over_the_limit(tmp_path: Path) -> None:
    big = ROOT / "controller" / "fleetctl" / "state" / "ledger.py"
    assert oversized([big], limit=100) == [f"{big.relative_to(ROOT)}: "
                                            f"{len(big.read_text().splitlines())} lines"]
