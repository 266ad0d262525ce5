"""docs/design.md's Layout (the file map, moved there from the README) names every part of the
house: each folder of the repository, each package folder of ``controller/fleetctl/`` and each
module of its top level on a line of its own, and each
module of a subpackage in its folder's lines. A new module or folder fails this test until it is
given its words.

The Layout is an indented block; a line that starts with a name (``cli/``, ``access.py``) opens that
name's entry, nested under the entry above it that is less indented, and the lines after it that
start in the description column carry on its text::

    controller/fleetctl/     the Python controller
      rollout/               api.py (...), session.py (...),
                             plan.py (...)
        deeper/              a package inside rollout/
      access.py              one line for a module of the top level
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path("controller/fleetctl")

#: A line that opens an entry: indentation, one name (a folder with ``/`` or a ``.py``), then the
#: text.
ENTRY = re.compile(r"^( {4,})([\w.-]+(?:/[\w.-]+)*/|[\w.-]+\.py)(?: {2,}(.*))?$")
#: A module named in an entry's text: ``plan.py``, not ``soak/plan.py`` nor ``x.plan.py``.
MODULE = re.compile(r"(?<![\w./-])(\w+\.py)\b")


@dataclass
class Entry:
    #: From the repository's root: "controller/fleetctl/rollout/", "controller/fleetctl/access.py".
    path: str
    text: list[str] = field(default_factory=list)


def layout_section(readme: str) -> str:
    """The indented block(s) of the ``## Layout`` section (docs/design.md's)."""
    m = re.search(r"^## Layout\n(.*?)(?=^## )", readme, re.S | re.M)
    assert m, "docs/design.md has no '## Layout' section followed by another section"
    return m.group(1)


def entries(section: str) -> list[Entry]:
    out: list[Entry] = []
    stack: list[tuple[int, str]] = []  # (indentation, folder path) of the open folders
    column = 0  # where the last entry's text began: a line indented that far carries it on
    for line in section.splitlines():
        indented = len(line) - len(line.lstrip(" "))
        m = ENTRY.match(line)
        if m is None or (out and indented >= column):
            if out and indented >= 4 and line.strip():
                out[-1].text.append(line.strip())
            continue
        indent, name, text = len(m.group(1)), m.group(2), m.group(3) or ""
        column = m.start(3) if m.group(3) else indent + len(name) + 2
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + name
        out.append(Entry(path, [text]))
        if name.endswith("/"):
            stack.append((indent, path))
    return out


def repo_folders(root: Path) -> set[str]:
    """The repository's top-level folders that git tracks (those on disk where git cannot say),
    hidden ones aside."""
    try:
        files = subprocess.run(
            ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True
        ).stdout
        tops = {f.split("/")[0] for f in files.splitlines() if "/" in f}
    except (OSError, subprocess.CalledProcessError):
        tops = {p.name for p in root.iterdir() if p.is_dir()}
    return {f"{t}/" for t in tops if not t.startswith(".") and not t.endswith(".egg-info")}


def not_named(root: Path, readme: str) -> list[str]:
    """What the Layout leaves out or names wrongly, one line each, saying where it belongs."""
    got = {e.path: e for e in entries(layout_section(readme))}
    pkg = root / PACKAGE
    wrong: list[str] = []
    for folder in sorted(repo_folders(root)):
        if not any(p == folder or p.startswith(folder) for p in got):
            wrong.append(f"{folder}: a folder of the repository: give it a line of its own")
    packages = sorted(d for d in pkg.rglob("*") if d.is_dir() and (d / "__init__.py").is_file())
    for d in [pkg, *packages]:
        folder = f"{d.relative_to(root)}/"
        if folder not in got:
            wrong.append(f"{folder}: a package folder: give it a line of its own")
            continue
        named = {n for t in got[folder].text for n in MODULE.findall(t)}
        for module in sorted(d.glob("*.py")):
            path = str(module.relative_to(root))
            if module.name.startswith("__") or path in got:
                continue
            if d == pkg:
                wrong.append(
                    f"{path}: a module of the package's top level: give it a line of its own"
                )
            elif module.name not in named:
                wrong.append(f"{path}: name {module.name} in the lines of {folder}")
        for name in sorted(named - {m.name for m in d.glob("*.py")}):
            wrong.append(
                f"{folder}{name}: named in the lines of {folder}, but there is no such module"
            )
    for path in sorted(got):
        if not (root / path).exists():
            wrong.append(
                f"{path}: has a line, but there is no such "
                f"{'folder' if path.endswith('/') else 'file'}"
            )
    return wrong


def test_the_layout_names_every_folder_and_module() -> None:
    wrong = not_named(ROOT, (ROOT / "docs" / "design.md").read_text())
    assert not wrong, "docs/design.md's Layout is not the house as it stands:\n" + "\n".join(wrong)


def test_the_layout_check_sees_what_is_missing(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    for d in ("rollout/deeper", "soak", "cli"):
        (pkg / d).mkdir(parents=True)
    for f in (
        "__init__.py",
        "access.py",
        "paths.py",
        "rollout/__init__.py",
        "rollout/plan.py",
        "rollout/step.py",
        "rollout/bake.py",
        "rollout/deeper/__init__.py",
        "rollout/deeper/x.py",
        "soak/__init__.py",
        "soak/run.py",
        "cli/__init__.py",
        "cli/main.py",
    ):
        (pkg / f).write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("")
    readme = """# x

## Layout

    controller/fleetctl/     the package
      rollout/               plan.py (waves), gone.py, see soak/run.py,
                             step.py
        deeper/              x.py
      cli/                   main.py
      access.py              how a host is reached
      old.py                 removed since

## Next
"""
    assert not_named(tmp_path, readme) == [
        "docs/: a folder of the repository: give it a line of its own",
        "controller/fleetctl/paths.py: a module of the package's top level: give it a line of its "
        "own",
        "controller/fleetctl/rollout/bake.py: name bake.py in the lines of "
        "controller/fleetctl/rollout/",
        "controller/fleetctl/rollout/gone.py: named in the lines of controller/fleetctl/rollout/, "
        "but there is no such module",
        "controller/fleetctl/soak/: a package folder: give it a line of its own",
        "controller/fleetctl/old.py: has a line, but there is no such file",
    ]
