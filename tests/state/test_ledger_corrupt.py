"""A ledger file that is not one is one error naming the file and the fix (issue 39, low 10).

Before: random bytes, plain text, a truncated file, a directory in its place or an unreadable file
ended ``fleetctl history`` in exit 70, "internal error". Each case here replaces the ledger of a
state directory and runs the real command, in this process, as the installed one runs it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.state.ledger import LEDGER_NAME, Ledger
from tests.cli.test_hostile_input import Listener, fleet, run  # noqa: F401 (fixtures)


def _random(p: Path) -> None:
    p.write_bytes(os.urandom(8192))


def _text(p: Path) -> None:
    p.write_text("rollout ro-1 done\n" * 200)


def _truncated(p: Path) -> None:
    Ledger(p).close()
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3] if len(data) > 4096 else data[:50])


def _directory(p: Path) -> None:
    p.mkdir()


def _unreadable(p: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    Ledger(p).close()
    p.chmod(0)


@pytest.mark.parametrize("spoil", [_random, _text, _truncated, _directory, _unreadable])
def test_a_ledger_that_is_not_one_is_exit_2_naming_the_file_and_the_fix(
    fleet: tuple[Path, Listener],  # noqa: F811
    run: Callable[..., tuple[int, str, str]],  # noqa: F811
    tmp_path: Path, spoil: Callable[[Path], None],
) -> None:
    hosts, _ = fleet
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    ledger = state / LEDGER_NAME
    spoil(ledger)
    code, _, err = run(hosts, "history")
    assert code == 2, err
    assert "internal error" not in err and "Traceback" not in err
    assert f"the ledger {ledger} cannot be read" in err and f"mv {ledger}" in err, err
    # the fix works: moved aside, the next command starts an empty ledger
    shutil.move(str(ledger), str(ledger) + ".bad")
    code, _, err = run(hosts, "history")
    assert code == 0, err
