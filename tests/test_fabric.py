"""Fabric and parity preflight: the tools' output parsed (fixtures in tests/fixtures/fabric) and
judged."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetctl import fabric
from fleetctl.errors import FleetError
from fleetctl.fabric import MemberFabric
from fleetctl.inventory import Fabric, Unit

FIX = Path(__file__).parent / "fixtures" / "fabric"

UNIT = Unit("pair-a", ("spark-07", "spark-08"), {
    "spark-07": Fabric(addresses=("192.168.177.11", "192.168.178.11")),
    "spark-08": Fabric(addresses=("192.168.177.12", "192.168.178.12")),
})


def read(name: str) -> str:
    return (FIX / name).read_text()


def facts(
    ibdev: str = "ibdev2netdev-spark.txt",
    ibstat: str = "ibstat-spark.txt",
    ip: str = "ip-addr-spark.json",
    route: str = "ip-route-get-fabric.json",
) -> MemberFabric:
    return MemberFabric(
        fabric.parse_ibdev2netdev(read(ibdev)),
        fabric.parse_ibstat(read(ibstat)),
        fabric.parse_ip_links(read(ip)),
        {"192.168.177.12": fabric.parse_route_get(read(route))},
    )


def messages(found: list[fabric.Finding]) -> list[str]:
    return [f.message() for f in found]


def test_parsers_read_a_spark() -> None:
    hcas = fabric.parse_ibdev2netdev(read("ibdev2netdev-spark.txt"))
    assert [(h.hca, h.netdev, h.up) for h in hcas.values()] == [
        ("rocep1s0f0", "enp1s0f0np0", False), ("rocep1s0f1", "enp1s0f1np1", True),
        ("roceP2p1s0f0", "enP2p1s0f0np0", False), ("roceP2p1s0f1", "enP2p1s0f1np1", True)]
    ports = fabric.parse_ibstat(read("ibstat-spark.txt"))
    assert set(ports) == set(hcas)
    p = ports["roceP2p1s0f1"]
    assert (p.state, p.physical_state, p.rate_gbps, p.link_layer, p.active) == (
        "Active",
        "LinkUp",
        200,
        "Ethernet",
        True,
    )
    assert not ports["rocep1s0f0"].active
    links = fabric.parse_ip_links(read("ip-addr-spark.json"))
    assert links["enp1s0f1np1"].mtu == 9000 and links["enp1s0f1np1"].up
    assert links["enp1s0f1np1"].addresses == ("192.168.177.11",) and not links["enp1s0f0np0"].up
    assert fabric.parse_route_get(read("ip-route-get-mgmt.json")) == "enP7s7"
    assert fabric.parse_route_get("[]") is None


def test_all_reduce_table() -> None:
    good = fabric.parse_all_reduce(read("all_reduce_perf-pair.txt"))
    assert len(good.rows) == 32 and good.rows[0][0] == 8 and good.wrong == 0
    assert 23.5 < good.peak_busbw_gbs <= 24.0 and good.avg_busbw_gbs == pytest.approx(11.3338)
    slow = fabric.parse_all_reduce(read("all_reduce_perf-mgmt.txt"))
    assert slow.peak_busbw_gbs < 3.2
    assert fabric.check_bandwidth(UNIT, good) == []
    found = fabric.check_bandwidth(UNIT, slow)
    assert [f.check for f in found] == ["bandwidth"]
    assert (
        found[0]
        .message()
        .startswith("pair-a: all_reduce bus bandwidth 3.1 GB/s, expected at least 20.0: ")
    )
    with pytest.raises(FleetError, match="no result row"):
        fabric.parse_all_reduce("# nThread 1\nNCCL WARN NET/IB : Got completion with error 12\n")


def test_wrong_results_fail_even_when_fast() -> None:
    text = read("all_reduce_perf-pair.txt").replace(
        "float     sum      -1   715856   24.00   24.00      0",
        "float     sum      -1   715856   24.00   24.00      3",
    )
    found = fabric.check_bandwidth(UNIT, fabric.parse_all_reduce(text))
    assert [(f.check, f.measured) for f in found] == [("nccl", 3)]


def test_a_healthy_member_passes() -> None:
    assert fabric.check_member(UNIT, "spark-07", facts()) == []


def test_mtu_1500_is_named_with_the_figure_and_the_fix() -> None:
    found = fabric.check_member(UNIT, "spark-07", facts(ip="ip-addr-mtu1500.json"))
    assert messages(found) == [
        "spark-07: enp1s0f1np1 MTU 1500, expected 9000: set mtu 9000 in its netplan "
        "(/etc/netplan (e.g. 40-cx7.yaml), then `sudo netplan apply`), on every member"
    ]
    assert (found[0].measured, found[0].expected) == (1500, 9000)
    e = found[0].error()
    assert e.host == "spark-07" and "MTU 1500" in e.cause and e.fix and "mtu 9000" in e.fix


def test_one_half_down() -> None:
    found = fabric.check_member(UNIT, "spark-07", facts(ibdev="ibdev2netdev-half-down.txt",
                                                        ibstat="ibstat-half-down.txt"))
    assert [f.check for f in found] == ["hca"]
    assert (
        found[0]
        .message()
        .startswith("spark-07: roceP2p1s0f1 (enP2p1s0f1np1) is Disabled, expected Active/LinkUp")
    )
    # ibdev2netdev alone (no ibstat on the member) still sees it
    only = MemberFabric(
        fabric.parse_ibdev2netdev(read("ibdev2netdev-half-down.txt")),
        {},
        fabric.parse_ip_links(read("ip-addr-spark.json")),
        missing={"ibstat": "command not found"},
    )
    assert [f.check for f in fabric.check_member(UNIT, "spark-07", only)] == ["tool ibstat", "hca"]


def test_a_slow_cable() -> None:
    found = fabric.check_member(UNIT, "spark-07", facts(ibstat="ibstat-slow-cable.txt"))
    assert [f.what for f in found] == ["rocep1s0f1 (enp1s0f1np1) at 100 Gb/s, expected 200",
                                       "roceP2p1s0f1 (enP2p1s0f1np1) at 100 Gb/s, expected 200"]


def test_the_fabric_routed_over_the_management_network() -> None:
    found = fabric.check_member(
        UNIT, "spark-07", facts(route="ip-route-get-mgmt.json"), mgmt_interfaces=["enP7s7"]
    )
    assert [f.check for f in found] == ["route"]
    assert (
        "traffic to spark-08's fabric address 192.168.177.12 leaves through enP7s7 (the management "
        "network), "
        "not enp1s0f1np1"
    ) in found[0].what
    # the management netdev found by the address fleetctl reaches the host at
    by_address = fabric.check_member(
        UNIT, "spark-07", facts(route="ip-route-get-mgmt.json"), mgmt_address="10.20.0.11"
    )
    assert [f.what for f in by_address] == [f.what for f in found]


def test_a_missing_address_and_netdev() -> None:
    found = fabric.check_member(UNIT, "spark-07", facts(ip="ip-addr-no-address.json"))
    assert messages(found)[0].startswith(
        "spark-07: fabric address 192.168.177.11 is not on enp1s0f1np1 "
        "(enp1s0f1np1 has no address): give enp1s0f1np1 the address"
    )
    other = Unit("u", UNIT.members, {**UNIT.fabric, "spark-07": Fabric(interfaces=("enp9s0",),
                                                                      addresses=("192.168.177.11",))})
    found = fabric.check_member(other, "spark-07", facts())
    assert found[0].what.startswith("no netdev enp9s0 (it has: enP2p1s0f0np0, ")


def test_member_probe_script_runs_and_parses(tmp_path: Path) -> None:
    """The probe script run by a real sh, with the tools replaced by scripts printing the
    fixtures."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool, out in (
        ("ibdev2netdev", "ibdev2netdev-half-down.txt"),
        ("ibstat", "ibstat-half-down.txt"),
    ):
        (bindir / tool).write_text(f"#!/bin/sh\ncat {FIX / out}\n")
    (bindir / "ip").write_text(
        f'#!/bin/sh\ncase "$*" in\n  *route*) cat {FIX / "ip-route-get-mgmt.json"};;\n'
        f"  *) cat {FIX / 'ip-addr-mtu1500.json'};;\nesac\n"
    )
    for f in bindir.iterdir():
        f.chmod(0o755)
    script = fabric.member_probe_script(UNIT, "spark-07")
    r = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{bindir}:/usr/bin:/bin"}, check=True)
    got = fabric.parse_member_probe(r.stdout)
    assert got.missing == {} and got.routes == {"192.168.177.12": "enP7s7"}
    assert sorted(f.check for f in fabric.check_member(UNIT, "spark-07", got)) == [
        "hca",
        "mtu",
        "route",
    ]
    # without ibstat installed: named as a missing tool, not a down port
    (bindir / "ibstat").unlink()
    r = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{bindir}:/usr/bin:/bin"}, check=True)
    got = fabric.parse_member_probe(r.stdout)
    assert list(got.missing) == ["ibstat"] and "not found" in got.missing["ibstat"]


def test_parity_names_the_member_that_drifted() -> None:
    same = {"driver": "580.95.05", "kernel": "6.11.0-1016-nvidia", "dgx_release": "DGX OS 7.2.3",
            "docker": "28.3.3", "toolkit": "1.17.8", "image_digest": "sha256:aaa"}
    assert fabric.check_parity(UNIT, {"spark-07": same, "spark-08": dict(same)}) == []
    found = fabric.check_parity(UNIT, {"spark-07": same, "spark-08": {**same, "driver": "580.82.09",
                                                                     "image_digest": "sha256:bbb"}})
    assert messages(found) == [
        "spark-08: driver 580.82.09, the head spark-07 has 580.95.05: install the same NVIDIA "
        "driver on every member "
        "(fleetctl provision reports each host's)",
        "spark-08: image digest sha256:bbb, the head spark-07 has sha256:aaa: pull the same image "
        "digest on every "
        "member (a rollout starts every member by digest)",
    ]
    unknown = fabric.check_parity(
        UNIT, {"spark-07": same, "spark-08": {**same, "kernel": None}}, fields=["kernel"]
    )
    assert [(f.host, f.what) for f in unknown] == [
        ("spark-08", "kernel unknown (the probe could not read it)")
    ]


def test_collective_errors_are_picked_out_of_a_members_log() -> None:
    log = "\n".join(
        [
            "(APIServer pid=7) INFO 11-25 02:13:50 [api_server.py:1647] Starting vLLM API server 0 "
            "on http://0.0.0.0:8000",
            "spark-08:123:456 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE "
            "[1]roceP2p1s0f1:1/RoCE",
            "spark-08:123:789 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from "
            "peer 192.168.177.17<52712> "
            "with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) reqSize=0 vendor_err=129 "
            "req_type=Send",
            "[rank1]:[E1125 02:14:10.1 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught "
            "collective operation timeout",
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
            "by peer [192.168.177.17]:2304",
            'INFO:     127.0.0.1:40000 - "GET /health HTTP/1.1" 200 OK',
        ]
    )
    found = fabric.collective_errors(log)
    assert [line[:40] for line in found] == [
        "spark-08:123:789 [0] transport/net_ib.cc", "[rank1]:[E1125 02:14:10.1 ProcessGroupNC",
        "RuntimeError: [../third_party/gloo/gloo/"]
    assert fabric.collective_errors("INFO all good\n") == []


def test_the_probes_link_lines_name_the_slow_member() -> None:
    text = read("all_reduce_perf-mgmt.txt") + (
        "# link 192.168.177.12 -> 192.168.177.11 : 0.046 GB/s\n"
        "# link 192.168.177.11 -> 192.168.177.12 : 3.300 GB/s\n")
    result = fabric.parse_all_reduce(text)
    assert result.links[0] == ("192.168.177.12", "192.168.177.11", 0.046)
    found = fabric.check_bandwidth(UNIT, result)
    assert [f.host for f in found] == ["spark-08"]
    assert (
        found[0]
        .message()
        .startswith(
            "spark-08: all_reduce bus bandwidth 3.1 GB/s, expected at least 20.0 (unit pair-a; the "
            "slowest link "
            "spark-08 -> spark-07 measured 0.046 GB/s): check that both HCAs are up"
        )
    ), found[0].message()
    assert "`ip route get PEER` on spark-08" in found[0].fix
