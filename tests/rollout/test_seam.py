"""The engine touches a host only through ``HostOps`` (docs/design.md, "Seams").

Every module of ``fleetctl/rollout/`` is read with ``ast``: only the HostOps implementation over SSH
(:data:`IMPLEMENTATION`) may use a name of ``fleetctl.ssh`` that runs something on a host
(``run``, ``docker``, ``check_access``, ``put_text``, or any name added later); the others may use
only the bounded fan-out and its outcome type, which run nothing themselves. And every
implementation of the seam (over SSH, the simulated fleet) has every
operation of the Protocol, so that the simulated fleet sees every command the engine runs.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from fleetctl.rollout import host as remote
from tests.rollout.sim import SimOps

ROLLOUT = Path(__file__).resolve().parents[2] / "controller" / "fleetctl" / "rollout"
#: The HostOps implementation over SSH: the serving container's operations, and the rest.
IMPLEMENTATION = frozenset({"host.py", "host_ssh.py"})
#: What of ``fleetctl.ssh`` the rest of the engine may use: it runs nothing on a host by itself.
ALLOWED = frozenset({"fan_out", "Outcome", "FAN_OUT_WORKERS"})


def host_commands(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, name) of every use of a ``fleetctl.ssh`` name outside :data:`ALLOWED` in ``source``:
    through ``from fleetctl import ssh [as x]``, ``import fleetctl.ssh [as x]`` or
    ``from fleetctl.ssh import name``."""
    tree = ast.parse(source, filename)
    aliases: set[str] = set()
    dotted = False  # `import fleetctl.ssh`: used as fleetctl.ssh.NAME
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == "fleetctl":
                aliases |= {a.asname or a.name for a in node.names if a.name == "ssh"}
            elif node.module == "fleetctl.ssh":
                out += [(node.lineno, a.name) for a in node.names if a.name not in ALLOWED]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "fleetctl.ssh":
                    if a.asname:
                        aliases.add(a.asname)
                    else:
                        dotted = True
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr in ALLOWED:
            continue
        v = node.value
        if (isinstance(v, ast.Name) and v.id in aliases) or (
                dotted and isinstance(v, ast.Attribute) and v.attr == "ssh"
                and isinstance(v.value, ast.Name) and v.value.id == "fleetctl"):
            out.append((node.lineno, node.attr))
    return sorted(out)


def test_only_the_hostops_implementation_runs_commands_on_a_host() -> None:
    engine = sorted(p for p in ROLLOUT.glob("*.py") if p.name not in IMPLEMENTATION)
    assert len(engine) > 10, "the engine's modules are found"
    wrong = [f"rollout/{p.name}:{line}: ssh.{name}" for p in engine
             for line, name in host_commands(p.read_text(), str(p))]
    assert not wrong, ("the engine runs these on a host without HostOps (give the operation a name "
                       "in HostOps, SshHostOps and the simulated fleet):\n"
                       + "\n".join(wrong))


def test_the_checker_sees_a_command_run_around_the_seam() -> None:
    # What the prefetch's image probe and the image tree did before HostOps had their operations.
    old = ("from fleetctl import registry, ssh\n"
           "has = ssh.fan_out(hosts, lambda h: ssh.docker(h, probe).rc == 0, timeout=90)\n"
           "access = ssh.fan_out(hosts, ssh.check_access, timeout=60)\n")
    assert host_commands(old) == [(2, "docker"), (3, "check_access")]
    assert host_commands("import fleetctl.ssh\nfleetctl.ssh.run(h, 'true')\n") == [(2, "run")]
    assert host_commands("import fleetctl.ssh as s\ns.put_text(h, '/x', 'y')\n") == [
        (2, "put_text")]
    assert host_commands("from fleetctl.ssh import docker, fan_out\n") == [(1, "docker")]
    assert host_commands("from fleetctl import ssh as t\nt.fan_out(hs, f)\nx: t.Outcome[int]\n") \
        == []
    assert host_commands("from fleetctl import ssh\nssh.exec_anything(h)\n") == [
        (2, "exec_anything")]


def _operations(protocol: type) -> set[str]:
    """The members a Protocol declares, its slices' included."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if getattr(cls, "_is_protocol", False) and cls.__module__.startswith("fleetctl"):
            names |= {n for n in vars(cls) if not n.startswith("_")}
    return names


def test_every_implementation_has_every_operation_of_the_seam() -> None:
    ops = _operations(remote.HostOps)
    assert {"has_image", "start_relay", "fill_relay", "remove_relay", "export_cache",
            "verify_cache", "import_cache", "bandwidth_probe", "read_state", "swap_state",
            "check_access", "staged_bytes", "logs", "inspect", "pull", "start"} <= ops
    for impl in (remote.SshHostOps, SimOps):
        missing = sorted(n for n in ops - {"host"} if not callable(getattr(impl, n, None)))
        assert not missing, f"{impl.__name__} lacks {missing}"
        for n in ops - {"host"}:
            want = list(inspect.signature(getattr(remote.HostOps, n)).parameters)
            have = list(inspect.signature(getattr(impl, n)).parameters)
            assert have == want, f"{impl.__name__}.{n}{have} is not HostOps.{n}{want}"
