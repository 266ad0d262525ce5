"""`fleetctl status` on a unit over real SSH (a root sshd on loopback): each member's fabric probed
and judged.

Both members are this machine, reached through one sshd: it has no QSFP netdevs and no RDMA tools,
so the findings are exactly those a Spark without its fabric would give, each naming the member.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl import ssh
from fleetctl.cli.main import main
from tests import sshd

pytestmark = pytest.mark.skipif(not sshd.available(), reason="needs root and openssh-server")


@pytest.fixture
def inventory(tmp_path: Path) -> Iterator[Path]:
    sshd.keygen(tmp_path / "id")
    keys = tmp_path / "authorized_keys"
    keys.write_text((tmp_path / "id.pub").read_text())
    server = sshd.start(
        tmp_path, "units", "127.0.0.1", forwarding=False, allow_user="root", authorized_keys=keys
    )
    (tmp_path / "known_hosts").write_text(server.known())
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "group_vars" / "unit_pair_a.yml").write_text("fleetctl_unit: pair-a\n")
    (inv / "hosts.yml").write_text(f"""
all:
  vars:
    ansible_host: 127.0.0.1
    ansible_port: {server.port}
    ansible_user: root
    ansible_ssh_private_key_file: {tmp_path / 'id'}
    fleetctl_known_hosts: {tmp_path / 'known_hosts'}
  children:
    sparks:
      hosts:
        spark-01:
    unit_pair_a:
      hosts:
        spark-03: {{fleetctl_fabric: {{addresses: [127.0.0.23]}}}}
        spark-04: {{fleetctl_fabric: {{addresses: [127.0.0.24]}}}}
""")
    try:
        yield inv / "hosts.yml"
    finally:
        ssh.close_all()
        server.stop()


def test_status_probes_each_members_fabric(
    inventory: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "80")
    code = main(["-i", str(inventory), "status", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    assert doc["spark-01"]["unit"] is None and doc["spark-01"]["fabric"] is None
    for name, peer in (("spark-03", "127.0.0.24"), ("spark-04", "127.0.0.23")):
        st = doc[name]
        assert st["reachable"] and st["unit"] == "pair-a" and st["fabric"]["error"] is None
        found = {(f["host"], f["check"], f["what"]) for f in st["fabric"]["findings"]}
        peer_name = "spark-04" if name == "spark-03" else "spark-03"
        whats = [w for _, _, w in found]
        assert any(w.startswith("no netdev enp1s0f1np1 (it has: ") and "lo" in w for w in whats), (
            whats
        )
        assert any(w.startswith("no netdev enP2p1s0f1np1") for w in whats), whats
        assert (
            f"traffic to {peer_name}'s fabric address {peer} leaves through lo (the management "
            "network), "
            "not enp1s0f1np1: "
            "10-20x slower"
        ) in whats, whats
        assert any(c == "tool ibdev2netdev" and "not found" in w for _, c, w in found), found
        assert all(h == name for h, _, _ in found)
        # parity: one machine twice agrees with itself; what it cannot read (no GPU here) is never
        # assumed equal
        parity = {c: w for _, c, w in found if c.startswith("parity ")}
        assert "parity kernel" not in parity and "parity docker" not in parity, parity
        assert parity.get("parity driver") == "driver unknown (the probe could not read it)", parity
    code = main(["-i", str(inventory), "status"])
    text = capsys.readouterr().out
    assert "unit pair-a: spark-03 (head), spark-04: " in text and "fabric/parity problem(s)" in text
    assert (
        "spark-04: traffic to spark-03's fabric address 127.0.0.23 leaves through lo"
        in " ".join(text.split())
    )
