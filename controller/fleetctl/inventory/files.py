"""The inventory's own files, checked before ansible-core reads them: their size, YAML that
expands without bound, a syntax error with its line, a dynamic-inventory script that hangs."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from fleetctl.errors import InventoryError

#: Bounds on every inventory file read before ansible-core parses it: its size, and the number of
#: values it expands to (a few hundred bytes of nested YAML aliases expand to gigabytes).
MAX_FILE_BYTES = 16 << 20


MAX_YAML_VALUES = 2_000_000


#: Extensions Ansible reads in group_vars/ and host_vars/ (a file without one included).
_VAR_SUFFIXES = ("", ".yml", ".yaml", ".json")


#: Seconds a dynamic inventory script may take to list the fleet ($FLEETCTL_INVENTORY_TIMEOUT).
SCRIPT_TIMEOUT = 60.0


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
    base = source if source.is_dir() else source.parent
    for sub in ("group_vars", "host_vars"):
        root = base / sub
        if not root.is_dir():
            continue
        for f in sorted(root.rglob("*")):
            if f.is_file() and f.suffix in _VAR_SUFFIXES and not f.name.startswith("."):
                _check_yaml_file(f, mapping=True)


def _check_yaml_file(path: Path, mapping: bool) -> None:
    """Refuse a file that is too large, not text, not YAML, expands without bound, or (``mapping``)
    not a mapping."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InventoryError(
                f"{path}: {size} bytes, more than an inventory file may hold ({MAX_FILE_BYTES})",
                fix="split it, or check that this is the file you meant",
            )
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InventoryError(
            f"{path}: not UTF-8 text (byte {e.start}): a binary file?",
            fix="point the inventory at its YAML or INI file",
        ) from None
    except OSError as e:
        raise InventoryError(
            f"{path}: cannot read: {e.strerror}", fix="check the path and permissions"
        ) from None
    try:
        node = yaml.compose(
            text, Loader=yaml.SafeLoader
        )  # nodes only: no value is built, tags (!vault) kept
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InventoryError(
            f"{path}: not valid YAML{where}: {problem}", fix="correct the YAML syntax"
        ) from None
    if node is None:
        return
    if _expanded_size(node) > MAX_YAML_VALUES:
        raise InventoryError(
            f"{path}: expands to more than {MAX_YAML_VALUES} values through YAML aliases",
            fix="write the values out, or use fewer nested aliases (&anchor / *alias)",
        )
    if mapping and not isinstance(node, yaml.MappingNode):
        raise InventoryError(
            f"{path}: line {node.start_mark.line + 1}: variables must be a mapping "
            f"(name: value), not a {type(node).__name__.removesuffix('Node').lower()}",
            fix="write the variables as `name: value` lines",
        )


def _expanded_size(root: yaml.Node) -> int:
    """How many values ``root`` stands for once every alias is expanded (each node counted once per
    use)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # iterative post-order: deep nesting must not overflow Python's stack
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done or not children:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[id(node)] > MAX_YAML_VALUES:
                return sizes[id(node)]
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


class _TagTolerantLoader(yaml.SafeLoader):
    """SafeLoader that accepts Ansible's tags (``!vault``, ``!unsafe``): ansible-core gives them
    meaning."""


_TagTolerantLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def check_source(p: Path) -> None:
    """The checks fleetctl makes on an inventory's files before ansible-core reads them."""
    if p.is_file() and p.suffix in (".yml", ".yaml"):
        # a syntax error gets its line and column here, not a generic "failed to parse"
        _check_yaml_file(p, mapping=False)
    check_var_files(p)
    if p.is_file() and os.access(p, os.X_OK):
        _check_script_answers(p)
