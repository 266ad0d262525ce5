"""Liveness by generated tokens, against real emulator processes on loopback: a unit (head +
headless worker) that serves passes; once its worker is killed the head still answers /health 200
and the check
fails with that fact and the members' NCCL lines as the cause; a server that is down is an error."""

from __future__ import annotations

import signal
from pathlib import Path

from fleetctl.soak.liveness import check_liveness
from fleetctl.soak.verdict import SoakTarget
from tests.lab.emulator.test_multinode import pair, wait_log
from tests.lab.emulator.test_server import Launcher, _free_port


def test_a_wedged_unit_fails_liveness_with_the_fact_and_its_cause(
    launcher: Launcher, model: Path
) -> None:
    head, (worker,) = pair(launcher, model, _free_port())
    target = SoakTarget("pair-a", head.url)
    ok = check_liveness(target, "glm-pair", window=30)
    assert ok.outcome == "pass" and ok.health == 200 and ok.first_token_s is not None, ok
    worker.proc.send_signal(signal.SIGKILL)
    worker.proc.wait(timeout=10)
    wait_log(head, "Watchdog caught collective operation timeout")
    wedged = check_liveness(
        target,
        "glm-pair",
        window=3,
        member_logs=lambda: {"spark-03": head.text(), "spark-04": worker.text()},
    )
    assert wedged.outcome == "fail" and wedged.health == 200 and wedged.first_token_s is None, (
        wedged
    )
    assert wedged.detail == "/health answers 200 but no token came in 3 s (expected one within 3 s)"
    assert any(c.startswith("spark-03: ") and "Watchdog caught collective operation timeout" in c
               for c in wedged.cause), wedged.cause


def test_a_server_that_is_down_is_an_error(launcher: Launcher) -> None:
    down = check_liveness(SoakTarget("x", f"http://127.0.0.1:{_free_port()}"), "m", window=3)
    assert (
        down.outcome == "error" and down.health is None and down.detail.startswith("/health: ")
    ), down
