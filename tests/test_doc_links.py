"""The docs point only inside the repository, and at what is there: every relative link of every
tracked Markdown file (``[text](path)`` or ``[text](path#anchor)``) names a file or folder of the
checkout, never one above it (``../shared/...``), and an anchor into a Markdown file names one of
its headings (as GitHub spells them: lower case, punctuation dropped, spaces as ``-``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: A Markdown link's target, outside code spans; images too.
LINK = re.compile(r"\]\(([^()\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def markdown_files(root: Path) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    return [root / f for f in out.splitlines()]


def bad_links(root: Path, files: list[Path]) -> list[str]:
    wrong: list[str] = []
    for f in files:
        text = CODE.sub("", FENCE.sub("", f.read_text()))
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            where = f"{f.relative_to(root)}: ({target})"
            if not dest.is_relative_to(root):
                wrong.append(f"{where} points outside the repository")
            elif not dest.exists():
                wrong.append(f"{where} names no file of the repository")
            elif anchor and dest.suffix == ".md" and anchor not in {
                slug(h) for h in HEADING.findall(FENCE.sub("", dest.read_text()))
            }:
                wrong.append(f"{where}: {dest.relative_to(root)} has no heading #{anchor}")
    return wrong


def test_every_doc_link_stays_in_the_repository_and_resolves() -> None:
    wrong = bad_links(ROOT, markdown_files(ROOT))
    assert not wrong, "\n".join(wrong)


def test_the_link_check_sees_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## `fleetctl soak`\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/a.md#fleetctl-soak) [web](https://example.invalid/x) `[code](../x.md)`\n"
        "[up](../shared/STYLE.md) [gone](docs/b.md) [anchor](docs/a.md#fleetctl-watch)\n"
    )
    assert bad_links(tmp_path, [readme]) == [
        "README.md: (../shared/STYLE.md) points outside the repository",
        "README.md: (docs/b.md) names no file of the repository",
        "README.md: (docs/a.md#fleetctl-watch): docs/a.md has no heading #fleetctl-watch",
    ]
