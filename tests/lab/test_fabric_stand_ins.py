"""The lab fabric's pure parts (no lab needed): its subnets and names, the stand-in
ibdev2netdev/ibstat run for real against a fake sysfs and judged by fleetctl's own fabric checks,
and the via-management
script."""

from __future__ import annotations

import ipaddress
import os
import subprocess
from importlib import resources
from pathlib import Path

from fleetctl import fabric
from fleetctl.inventory import Fabric, Unit
from fleetctl.lab import fabric as lab_fabric
from fleetctl.lab.layout import Layout

TOOL = Path(str(resources.files("fleetctl.lab") / "assets" / "fabric")) / "spark-rdma"


def layout() -> Layout:
    return Layout(Path("/var/tmp/lab-x"), ipaddress.IPv4Network("10.78.116.0/24"))


def test_fabric_networks_and_addresses() -> None:
    a, b = lab_fabric.halves(layout())
    assert (str(a.subnet), str(b.subnet)) == ("10.178.116.0/24", "10.179.116.0/24")
    assert (a.netdev, b.netdev) == ("enp1s0f1np1", "enP2p1s0f1np1")
    assert (
        a.network != b.network and all(len(h.bridge) <= 15 for h in (a, b)) and a.bridge != b.bridge
    )
    assert lab_fabric.member_addresses(layout(), 1) == ["10.178.116.11", "10.179.116.11"]
    assert lab_fabric.member_addresses(layout(), 4) == ["10.178.116.14", "10.179.116.14"]


def run_tool(tmp: Path, name: str, sysfs: Path, *args: str) -> str:
    link = tmp / "bin" / name
    link.parent.mkdir(exist_ok=True)
    if not link.exists():
        link.symlink_to(TOOL)
    env = {**os.environ, "FLEETCTL_LAB_SYSFS_NET": str(sysfs)}
    return subprocess.run(
        [str(link), *args], capture_output=True, text=True, env=env, timeout=30, check=True
    ).stdout


def test_stand_in_tools_answer_like_a_spark_and_follow_the_netdevs(tmp_path: Path) -> None:
    sysfs = tmp_path / "net"
    for dev, state in (("enp1s0f1np1", "up"), ("enP2p1s0f1np1", "up"), ("eth0", "up")):
        (sysfs / dev).mkdir(parents=True)
        (sysfs / dev / "operstate").write_text(state + "\n")
    unit = Unit(
        "pair-a",
        ("spark-03", "spark-04"),
        {
            "spark-03": Fabric(addresses=("10.178.116.13",)),
            "spark-04": Fabric(addresses=("10.178.116.14",)),
        },
    )

    def judged() -> list[str]:
        facts = fabric.MemberFabric(
            fabric.parse_ibdev2netdev(run_tool(tmp_path, "ibdev2netdev", sysfs)),
            fabric.parse_ibstat(run_tool(tmp_path, "ibstat", sysfs)),
        )
        # the netdevs' own checks need `ip -j addr` (not faked here): the HCAs' are judged
        return [
            f.what
            for f in fabric.check_member(unit, "spark-03", facts)
            if f.check in ("hca", "rate")
        ]

    assert (
        run_tool(tmp_path, "ibdev2netdev", sysfs).splitlines()[1]
        == "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)"
    )
    assert judged() == []
    (sysfs / "enP2p1s0f1np1" / "operstate").write_text("down\n")  # lab node --fabric-down
    assert judged() == [
        "roceP2p1s0f1 (enP2p1s0f1np1) is Disabled, expected Active/LinkUp: NCCL gets half the "
        "port's bandwidth or falls back to sockets"
    ]
    one = fabric.parse_ibstat(run_tool(tmp_path, "ibstat", sysfs, "rocep1s0f1"))
    assert list(one) == ["rocep1s0f1"] and one["rocep1s0f1"].rate_gbps == 200


def test_via_mgmt_script_is_valid_sh_and_reversible() -> None:
    on = lab_fabric.via_mgmt_script([("10.178.116.14", "10.78.116.14")], on=True)
    off = lab_fabric.via_mgmt_script([("10.178.116.14", "10.78.116.14")], on=False)
    assert "ip route replace 10.178.116.14/32 via 10.78.116.14 dev eth0" in on
    assert "match ip dst 10.178.116.14/32 flowid 1:20" in on and "tc qdisc del dev eth0 root" in off
    for script in (on, off):
        subprocess.run(["sh", "-n"], input=script, text=True, check=True, timeout=10)
