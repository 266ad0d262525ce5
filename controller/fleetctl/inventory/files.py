"""The inventory's own files, checked before ansible-core reads them: their size (each, and all
together), YAML that expands without bound (in values or in bytes) or nests too deep, a syntax
error with its line, a dynamic-inventory script that hangs."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleetctl.errors import InventoryError

#: Bounds on the inventory files read before ansible-core parses them: each file's size, and the
#: size of all of them together (the source, a directory source's files, group_vars/, host_vars/).
MAX_FILE_BYTES = 16 << 20
MAX_TOTAL_BYTES = 16 << 20


#: Bounds on what the files expand to once every YAML alias is followed, all files together:
#: values (a few hundred bytes of nested aliases stand for a billion), bytes (a 1 MiB string used
#: a million times through two lists of aliases is a terabyte), and nesting (Python's parsers
#: recurse).
#: (250,000 values written out take ansible-core itself ~45 s and ~320 MB to read.)
MAX_YAML_VALUES = 250_000
MAX_YAML_BYTES = 64 << 20
MAX_YAML_DEPTH = 100


#: Extensions Ansible reads in group_vars/ and host_vars/ (a file without one included); its
#: yaml inventory plugin reads a source file with the same extensions.
_VAR_SUFFIXES = ("", ".yml", ".yaml", ".json")


#: Names ansible-core skips in a directory source (its INVENTORY_IGNORE_EXTS and the vars dirs).
_IGNORED = re.compile(r"^\.|^host_vars$|^group_vars$|^vars_plugins$|\.(pyc|pyo|swp|bak|rpm|md|txt"
                      r"|rst|orig|cfg|retry)$|~$")


#: Seconds a dynamic inventory script may take to list the fleet ($FLEETCTL_INVENTORY_TIMEOUT).
SCRIPT_TIMEOUT = 60.0


@dataclass
class _Budget:
    """What the inventory's files have expanded to so far, against the bounds on all of them."""

    values: int = 0
    nbytes: int = 0


def _check_script_answers(script: Path) -> None:
    """Run a dynamic inventory script's ``--list`` once, bounded: ansible-core would wait for ever.

    The script runs a second time inside ansible-core; a script that answers once within the
    bound is trusted to answer again.
    """
    import subprocess

    timeout = float(os.environ.get("FLEETCTL_INVENTORY_TIMEOUT") or SCRIPT_TIMEOUT)
    try:
        r = subprocess.run(
            [str(script), "--list"], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise InventoryError(
            f"{script}: the dynamic inventory script did not answer --list within {timeout:.0f} s",
            fix="check the script (what it calls may hang), or raise FLEETCTL_INVENTORY_TIMEOUT",
        ) from None
    except OSError as e:
        raise InventoryError(
            f"{script}: cannot run the inventory script: {e.strerror}",
            fix="check its #! line and permissions",
        ) from None
    if r.returncode != 0:
        tail = (
            r.stderr.decode(errors="replace").strip().splitlines() or [f"exit code {r.returncode}"]
        )[-1]
        raise InventoryError(f"{script}: the dynamic inventory script failed: {tail[:200]}",
                             fix="run it by hand with --list to see why")


def check_var_files(source: Path) -> None:
    """Every file of ``group_vars/`` and ``host_vars/`` beside ``source``: bounded, valid YAML, a
    mapping.

    ansible-core reports these as a traceback without file or line (or, for an alias bomb, runs out
    of memory); each is one InventoryError here, naming the file, line and column.
    """
    _check_files([], _var_files(source), _Budget())


def _var_files(source: Path) -> list[Path]:
    base = source if source.is_dir() else source.parent
    out: list[Path] = []
    for sub in ("group_vars", "host_vars"):
        root = base / sub
        if root.is_dir():
            out += [f for f in sorted(root.rglob("*")) if f.is_file() and f.suffix in _VAR_SUFFIXES
                    and not f.name.startswith(".")]
    return out


def _source_files(source: Path, seen: set[Path] | None = None) -> list[Path]:
    """The files ansible-core reads as the source (a directory: each of its files, recursively;
    a directory reached twice through symlinks, once)."""
    if not source.is_dir():
        return [source] if source.is_file() else []
    seen = set() if seen is None else seen
    if source.resolve() in seen:
        return []
    seen.add(source.resolve())
    out: list[Path] = []
    for name in sorted(os.listdir(source)):
        if not _IGNORED.search(name):
            out += _source_files(source / name, seen)
    return out


def _check_files(sources: list[Path], var_files: list[Path], budget: _Budget) -> None:
    """The bounds on all of the files together, then each file's own checks."""
    files = sources + var_files
    sizes = {f: _size(f) for f in files}
    total = sum(sizes.values())
    if total > MAX_TOTAL_BYTES:
        biggest = sorted(files, key=lambda f: -sizes[f])[:3]
        raise InventoryError(
            f"the inventory's files hold {total} bytes together, more than an inventory may "
            f"({MAX_TOTAL_BYTES}); the largest: "
            + ", ".join(f"{f} ({sizes[f]} bytes)" for f in biggest),
            fix="move data that is not inventory out of it, or check that these are the files "
                "you meant",
        )
    for f in sources:
        # what ansible-core's yaml plugin reads: a .yml source must be YAML; a .json or
        # extensionless one (JSON, or INI) is checked when it is YAML; a script is not read
        if f.suffix in _VAR_SUFFIXES and not (f.suffix == "" and os.access(f, os.X_OK)):
            _check_yaml_file(f, mapping=False, budget=budget, strict=f.suffix in (".yml", ".yaml"))
    for f in var_files:
        _check_yaml_file(f, mapping=True, budget=budget)


def _size(path: Path) -> int:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise InventoryError(
            f"{path}: cannot read: {e.strerror}", fix="check the path and permissions"
        ) from None
    if size > MAX_FILE_BYTES:
        raise InventoryError(
            f"{path}: {size} bytes, more than an inventory file may hold ({MAX_FILE_BYTES})",
            fix="split it, or check that this is the file you meant",
        )
    return size


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InventoryError(
            f"{path}: not UTF-8 text (byte {e.start}): a binary file?",
            fix="point the inventory at its YAML or INI file",
        ) from None
    except OSError as e:
        raise InventoryError(
            f"{path}: cannot read: {e.strerror}", fix="check the path and permissions"
        ) from None


def _yaml_error(path: Path, problem: str, mark: Any) -> InventoryError:
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return InventoryError(f"{path}: not valid YAML{where}: {problem}",
                          fix="correct the YAML syntax")


@dataclass
class _Shape:
    """What a YAML document stands for once every alias is expanded."""

    values: int = 0
    nbytes: int = 0
    depth: int = 0
    #: The top node's kind ("mapping", "sequence", "scalar") and line, None for an empty file.
    top: tuple[str, int] | None = None


def _measure(path: Path, text: str, strict: bool) -> _Shape | None:
    """The file's expanded size, read as a stream of YAML events (libyaml: no value is built, no
    recursion, tags such as !vault kept); None for a file that is not YAML and need not be
    (``strict`` False: an INI file). Stops reading past a bound."""
    shape = _Shape()
    anchors: dict[str, tuple[int, int]] = {}
    frames: list[list[Any]] = [[0, 0, None]]  # the document, then each open collection: values,
    docs = 0  # bytes, anchor
    try:
        for ev in yaml.parse(text, Loader=_PARSER):
            if isinstance(ev, yaml.DocumentStartEvent):
                docs += 1
                if docs > 1:
                    raise _yaml_error(path, "more than one document (---)", ev.start_mark)
            if not isinstance(ev, yaml.NodeEvent | yaml.CollectionEndEvent):
                continue
            if shape.top is None:
                kind = type(ev).__name__.removesuffix("Event").removesuffix("Start").lower()
                shape.top = (kind, ev.start_mark.line + 1 if ev.start_mark else 1)
            if isinstance(ev, yaml.CollectionStartEvent):
                frames.append([1, 0, ev.anchor])
                shape.depth = max(shape.depth, len(frames) - 1)
                if shape.depth > MAX_YAML_DEPTH:
                    return shape
                continue
            if isinstance(ev, yaml.CollectionEndEvent):
                values, nbytes, anchor = frames.pop()
            elif isinstance(ev, yaml.AliasEvent):
                if ev.anchor not in anchors:
                    raise _yaml_error(path, f"found undefined alias {ev.anchor!r}", ev.start_mark)
                values, nbytes, anchor = *anchors[ev.anchor], None
            else:
                values, nbytes, anchor = 1, len(ev.value), ev.anchor  # type: ignore[attr-defined]
            if anchor is not None:
                anchors[anchor] = (values, nbytes)
            frames[-1][0] += values
            frames[-1][1] += nbytes
            if frames[-1][0] > MAX_YAML_VALUES or frames[-1][1] > MAX_YAML_BYTES:
                break  # every frame holds less than the document: it is past the bound too
    except yaml.YAMLError as e:
        if "nesting depth" in str(e):  # libyaml's own bound (1,000) met before the event
            shape.depth = MAX_YAML_DEPTH + 1
            return shape
        if not strict:
            return None
        raise _yaml_error(path, getattr(e, "problem", None) or str(e).splitlines()[0],
                          getattr(e, "problem_mark", None)) from None
    shape.values, shape.nbytes = max(f[0] for f in frames), max(f[1] for f in frames)
    return shape


def _check_yaml_file(path: Path, mapping: bool, budget: _Budget | None = None,
                     strict: bool = True) -> None:
    """Refuse a file that is too large, not text, not YAML (``strict``), expands without bound
    (alone or with the files checked before it, ``budget``), or (``mapping``) not a mapping."""
    _size(path)
    text = _read_text(path)
    if text.startswith("$ANSIBLE_VAULT;"):
        return  # a file encrypted whole (ansible-vault encrypt): ansible-core decrypts it
    shape = _measure(path, text, strict)
    if shape is None or shape.top is None:
        return
    budget = budget or _Budget()
    budget.values += shape.values
    budget.nbytes += shape.nbytes
    if shape.depth > MAX_YAML_DEPTH:
        raise InventoryError(
            f"{path}: YAML nested more than {MAX_YAML_DEPTH} levels deep",
            fix="flatten the data: Ansible's variables need few levels",
        )
    if budget.values > MAX_YAML_VALUES:
        raise InventoryError(
            f"{path}: expands to more than {MAX_YAML_VALUES} values through YAML aliases "
            "(with the inventory files before it)",
            fix="write the values out, or use fewer nested aliases (&anchor / *alias)",
        )
    if budget.nbytes > MAX_YAML_BYTES:
        raise InventoryError(
            f"{path}: expands to more than {MAX_YAML_BYTES >> 20} MiB of text through YAML aliases "
            "(with the inventory files before it)",
            fix="write the values out, or use fewer aliases (&anchor / *alias) of long strings",
        )
    kind, line = shape.top
    if mapping and kind != "mapping":
        raise InventoryError(
            f"{path}: line {line}: variables must be a mapping (name: value), not a {kind}",
            fix="write the variables as `name: value` lines",
        )


#: libyaml's parser where PyYAML was built with it (it is: ansible-core wants it), else PyYAML's.
_PARSER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _TagTolerantLoader(yaml.SafeLoader):
    """SafeLoader that accepts Ansible's tags (``!vault``, ``!unsafe``): ansible-core gives them
    meaning."""


_TagTolerantLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def check_source(p: Path) -> None:
    """The checks fleetctl makes on an inventory's files before ansible-core reads them: a YAML
    syntax error gets its line and column here, not a generic "failed to parse"; a source read as
    YAML (a .yml, .json or extensionless file, alone or in a directory) and the vars files are
    bounded, each and together."""
    _check_files(_source_files(p), _var_files(p), _Budget())
    if p.is_file() and os.access(p, os.X_OK):
        _check_script_answers(p)
