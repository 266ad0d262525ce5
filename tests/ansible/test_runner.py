"""fleetctl.ansible: the run wrapper against a real ansible-playbook on localhost, and its pure
helpers."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetctl import ansible
from fleetctl import inventory as inv
from fleetctl.ansible import (
    AnsibleError,
    EventFolder,
    ansible_cfg,
    failure_message,
    format_diff,
    run_playbook,
)
from fleetctl.progress import Recorder

SECRET = "hf_s3cr3t-token-value-0123456789"

PLAYBOOK = """
- name: Exercise the wrapper
  hosts: all
  gather_facts: false
  tasks:
    - name: Report a fact to the controller
      ansible.builtin.set_fact:
        fleetctl_report:
          probe: {answer: 42}
          warnings: ["the next kernel has no module"]
    - name: "probe: echo a value"
      ansible.builtin.command: echo hello
      changed_when: false
    - name: Write a file (changes once)
      ansible.builtin.copy:
        dest: "{{ out_dir }}/{{ inventory_hostname }}.txt"
        content: "value={{ value }}\\n"
        mode: "0600"
    - name: Use a secret without logging it
      ansible.builtin.command: "true {{ token }}"
      changed_when: false
      no_log: true
    - name: Fail the host that is told to fail
      ansible.builtin.assert:
        that: not (must_fail | default(false))
        fail_msg: "{{ inventory_hostname }} was told to fail"
        quiet: true
"""


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[inv.Inventory, Path]:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "out").mkdir()
    (tmp_path / "hosts.yml").write_text(
        "all:\n  vars:\n    ansible_connection: local\n    ansible_python_interpreter: '{{ "
        "ansible_playbook_python }}'\n"
        "  hosts:\n    alpha: {}\n    beta: {must_fail: true}\n"
    )
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    return inv.load(tmp_path / "hosts.yml"), tmp_path


def test_run_folds_results_per_host_and_keeps_secrets_out(
    local: tuple[inv.Inventory, Path],
) -> None:
    inventory, tmp = local
    rec = Recorder()
    extravars = {"out_dir": str(tmp / "out"), "value": "one"}
    r = run_playbook(
        str(tmp / "play.yml"),
        inventory,
        extravars=extravars,
        secrets={"token": SECRET},
        progress=rec,
        collect=("probe:",),
    )
    assert list(r.hosts) == ["alpha", "beta"]
    a, b = r.hosts["alpha"], r.hosts["beta"]
    assert a.succeeded and a.changed == 1 and a.failed == 0
    assert not b.succeeded and b.failed == 1
    assert b.message == "Fail the host that is told to fail: beta was told to fail"
    assert r.failed_hosts == ["beta"] and not r.ok
    assert a.reports == {"probe": {"answer": 42}}
    assert a.warnings == ("the next kernel has no module",)
    assert [t.task for t in a.results] == ["probe: echo a value"]
    assert a.results[0].result["stdout"] == "hello"
    assert (tmp / "out" / "alpha.txt").read_text() == "value=one\n"
    # Progress: a task event per host with live counts, and a final phase per host.
    assert "task" in rec.phases("alpha") and rec.phases("alpha")[-1] == "done"
    assert rec.phases("beta")[-1] == "failed"
    # Artifacts: under the state dir, with the generated ansible.cfg, and no secret anywhere.
    assert r.artifacts_dir.is_relative_to(tmp / "state" / "runs" / r.run_id)
    assert "pipelining = True" in (r.artifacts_dir / "ansible.cfg").read_text()
    assert list((r.artifacts_dir / "job_events").glob("*.json"))
    for f in r.artifacts_dir.rglob("*"):
        if f.is_file():
            assert SECRET not in f.read_text(errors="replace"), f
    command = json.loads((r.artifacts_dir / "command").read_text())
    assert all(
        k.startswith(("ANSIBLE_", "LANG", "LC_"))
        or k in {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "AWX_ISOLATED_DATA_DIR"}
        for k in command["env"]
    )

    # A second run changes nothing; --check with a new value reports the change without making it.
    again = run_playbook(
        str(tmp / "play.yml"),
        inventory,
        extravars=extravars,
        secrets={"token": SECRET},
        limit="alpha",
    )
    assert list(again.hosts) == ["alpha"] and again.hosts["alpha"].changed == 0 and again.ok
    checked = run_playbook(str(tmp / "play.yml"), inventory, limit="alpha", check=True, diff=True,
                           extravars={**extravars, "value": "two"}, secrets={"token": SECRET})
    assert checked.check and checked.hosts["alpha"].changed == 1
    assert (tmp / "out" / "alpha.txt").read_text() == "value=one\n"
    assert any("+value=two" in d.diff for d in checked.hosts["alpha"].diffs)


def test_forks_one_per_host_up_to_the_cap_the_inventory_may_set(
    local: tuple[inv.Inventory, Path],
) -> None:
    inventory, _ = local
    assert [ansible.forks(inventory, n) for n in (0, 1, 16, 64, 256)] == [1, 1, 16, 64, 64]
    bigger = dataclasses.replace(inventory, vars={**inventory.vars, "fleetctl_ansible_forks": 128})
    assert ansible.forks(bigger, 256) == 128 and ansible.forks(bigger, 16) == 16
    for bad in (0, "many", True):
        with pytest.raises(AnsibleError, match="fleetctl_ansible_forks"):
            ansible.forks(
                dataclasses.replace(
                    inventory, vars={**inventory.vars, "fleetctl_ansible_forks": bad}
                ),
                8,
            )


def test_a_playbook_that_cannot_run_raises(local: tuple[inv.Inventory, Path]) -> None:
    inventory, tmp = local
    (tmp / "bad.yml").write_text(
        "- hosts: all\n  tasks:\n    - name: x\n      no_such_module_here: {}\n"
    )
    with pytest.raises(AnsibleError, match=r"could not run bad\.yml"):
        run_playbook(str(tmp / "bad.yml"), inventory)
    with pytest.raises(AnsibleError, match="not found"):
        run_playbook("no-such-playbook", inventory)


def test_ansible_cfg_is_safe_and_sized_for_the_fleet(local: tuple[inv.Inventory, Path]) -> None:
    inventory, _ = local
    cfg = ansible_cfg(inventory, ["alpha", "beta"], task_timeout=30)
    assert "forks = 2" in cfg and "host_key_checking = True" in cfg and "task_timeout = 30" in cfg
    assert "StrictHostKeyChecking=yes" in cfg and "UserKnownHostsFile=" in cfg
    # a forwarded agent would hand the operator's keys to root on every fleet host
    assert "-o ForwardAgent=no" in cfg
    assert "ControlPersist=" in cfg and "pipelining = True" in cfg
    control = cfg.split("control_path_dir = ", 1)[1].splitlines()[0]
    # A Unix socket path must stay under 108 bytes: directory + "/" + 40-hex %C hash.
    assert len(control) + 41 < 108


def test_failure_messages_are_readable() -> None:
    assert (
        failure_message({"msg": "GPU is an H100, not a GB10", "failed": True})
        == "GPU is an H100, not a GB10"
    )
    cmd = {"rc": 2, "cmd": ["docker", "run", "x"], "stderr": "warn\nError: no such image\n",
           "msg": "non-zero return code"}
    assert failure_message(cmd) == "`docker run x` exited 2: Error: no such image"
    loop = {
        "msg": "One or more items failed",
        "results": [{"failed": False}, {"failed": True, "msg": "bad item"}],
    }
    assert failure_message(loop) == "bad item"
    assert "no_log" in failure_message({"censored": "hidden"})


def test_format_diff_of_before_after() -> None:
    text = format_diff(
        {"before": "a\n", "after": "b\n", "before_header": "/etc/x", "after_header": "/etc/x"}
    )
    assert "-a" in text and "+b" in text
    assert format_diff([{"before": "same", "after": "same"}]) == ""


def test_event_folder_counts_from_recorded_events() -> None:
    rec = Recorder()
    folder = EventFolder(rec)
    events = [
        {"event": "runner_on_start", "event_data": {"host": "h1", "task": "Install the toolkit"}},
        {
            "event": "runner_on_ok",
            "event_data": {"host": "h1", "task": "Install the toolkit", "res": {"changed": True}},
        },
        {
            "event": "runner_on_unreachable",
            "event_data": {
                "host": "h2",
                "task": "Gather",
                "res": {
                    "msg": "ssh: connect to host 10.0.0.2 port 22: Connection timed out",
                    "unreachable": True,
                },
            },
        },
        {
            "event": "playbook_on_stats",
            "event_data": {
                "ok": {"h1": 1},
                "changed": {"h1": 1},
                "dark": {"h2": 1},
                "failures": {},
                "processed": {"h1": 1, "h2": 1},
            },
        },
    ]
    for e in events:
        assert folder(e) is True
    out = folder.results(["h1", "h2"])
    assert out["h1"].changed == 1 and out["h1"].succeeded
    assert out["h2"].status == "unreachable" and "Connection timed out" in out["h2"].message
    assert rec.events[1].data == {"task": "Install the toolkit", "ok": 1, "changed": 1, "failed": 0}


KILLED_RUN = """
import os, sys
from pathlib import Path
from fleetctl import inventory as inv
from fleetctl.ansible import run_playbook
tmp = Path(sys.argv[1])
run_playbook(str(tmp / "slow.yml"), inv.load(tmp / "hosts.yml"), run_id="killed")
"""


def test_a_controller_killed_mid_run_leaves_no_secret_of_its_environment(
    local: tuple[inv.Inventory, Path],
) -> None:
    """ansible-runner records its environment when it starts: only a minimal one may be there,
    SIGKILL or not."""
    _, tmp = local
    (tmp / "slow.yml").write_text(
        "- hosts: alpha\n  gather_facts: false\n  tasks:\n"
        "    - name: Wait to be killed\n      ansible.builtin.command: sleep 60\n"
    )
    secrets = {
        "HF_TOKEN": SECRET,
        "VLLM_API_KEY": "sk-" + SECRET[::-1],
        "FLEETCTL_REGISTRY_PASSWORD": "pw-" + SECRET,
        "FLEETCTL_WEBHOOK_URL": f"https://hooks.example/{SECRET}x",
    }
    env = {**os.environ, **secrets, "FLEETCTL_STATE_DIR": str(tmp / "state")}
    p = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, str(tmp)], env=env, start_new_session=True
    )
    run = tmp / "state" / "runs" / "killed"
    try:
        deadline = time.monotonic() + 120
        # Killed once the task runs: ansible-runner has written `command` and the first events by
        # then.
        while not any("Wait to be killed" in f.read_text(errors="replace")
                      for f in run.glob("ansible/slow/job_events/*.json")):
            assert p.poll() is None and time.monotonic() < deadline, (
                "the playbook never started its task"
            )
            time.sleep(0.2)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    command = json.loads((run / "ansible" / "slow" / "command").read_text())
    assert command["env"]["PATH"] and "HF_TOKEN" not in command["env"]
    leaked = [(f, k) for f in (tmp / "state").rglob("*") if f.is_file()
              for k, v in secrets.items() if v in f.read_text(errors="replace")]
    assert not leaked, leaked
