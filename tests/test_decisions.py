"""Each decision record's own heading carries its file's number: ``0014-....md`` starts ``# 14.
...``, so
"decision 0014" names one record whichever of the two a reader looks at."""

from __future__ import annotations

import re
from pathlib import Path

DECISIONS = Path(__file__).resolve().parents[1] / "docs" / "decisions"


def misnumbered(folder: Path) -> list[str]:
    """One line per record whose name or first heading does not carry its number as ``NNNN-`` / ``#
    N. ``."""
    wrong = []
    for path in sorted(folder.glob("*.md")):
        name = re.fullmatch(r"(\d{4})-[a-z0-9-]+\.md", path.name)
        if name is None:
            wrong.append(f"{path.name}: not named NNNN-words.md")
            continue
        first = path.read_text().split("\n", 1)[0]
        heading = re.match(r"# (\d+)\. \S", first)
        if heading is None or int(heading.group(1)) != int(name.group(1)):
            wrong.append(f"{path.name}: heading {first!r}, want '# {int(name.group(1))}. ...'")
    return wrong


def test_each_decision_heading_carries_its_files_number() -> None:
    wrong = misnumbered(DECISIONS)
    assert not wrong, "decision records whose heading and file name disagree:\n" + "\n".join(wrong)


def test_no_two_decisions_share_a_number() -> None:
    numbers = [p.name[:4] for p in DECISIONS.glob("*.md")]
    assert sorted(numbers) == sorted(set(numbers)), (
        f"numbers used twice: {sorted({n for n in numbers if numbers.count(n) > 1})}"
    )


def test_the_check_sees_a_wrong_number(tmp_path: Path) -> None:
    (tmp_path / "0011-one-stream.md").write_text("# 10. One event stream\n\nbody\n")
    (tmp_path / "0012-door.md").write_text("# 12. The door\n")
    (tmp_path / "0020-probe.md").write_text("# 0020: A probe\n")
    assert misnumbered(tmp_path) == [
        "0011-one-stream.md: heading '# 10. One event stream', want '# 11. ...'",
        "0020-probe.md: heading '# 0020: A probe', want '# 20. ...'",
    ]
