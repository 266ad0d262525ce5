"""The lab's fabric: a second pair of networks with MTU 9000 joining the members of each unit, and
its faults.

A Spark pair is linked by one QSFP cable whose two PCIe halves are two netdevs
(docs/domain.md#the-fabric).
The lab gives each unit member two more interfaces, on two bridge networks of the lab's own engine
created with MTU 9000 (one per half), renamed inside the node to a Spark's names (``enp1s0f1np1``,
``enP2p1s0f1np1``), and the stand-in ``ibdev2netdev``/``ibstat`` (``assets/fabric/spark-rdma``),
whose HCAs are up exactly when those netdevs are. The faults act on the node's real network state,
so that fleetctl's fabric checks (``fleetctl.fabric``) see them as they would on a Spark:

- ``set_mtu(..., 1500)``: the fabric netdev's MTU (and back with 9000);
- ``set_half_down(...)``: the second half's netdev down, so its HCA is Down/Disabled;
- ``set_via_mgmt(...)``: the peers' fabric addresses routed over the management network (eth0),
  rate-limited there (``tc``), so a measured link drops as a real one does.

Wiring (the lead's part, not done here): ``fleetctl lab up --units M`` calls :func:`ensure_networks`
once, then :func:`attach` and :func:`install_tools` for each member; the inventory writer gives each
member ``fleetctl_fabric: {addresses: member_addresses(layout, index)}`` and its ``fleetctl_unit``;
``fleetctl lab node NAME --fabric-mtu/--fabric-down/--fabric-via-mgmt`` call the setters; ``lab
down`` calls :func:`remove_networks` after the nodes are gone.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from fleetctl.errors import FleetError
from fleetctl.inventory import FABRIC_MTU, SPARK_INTERFACES
from fleetctl.lab.dockerd import Dockerd
from fleetctl.lab.layout import Layout
from fleetctl.lab.nodes import exec_, write_file

#: The interface the management network has inside a node.
MGMT_INTERFACE = "eth0"
#: The rate of the "management network" when the fabric is routed over it (a Spark's 10 GbE, scaled
#: down like the rest of the lab: what matters is that it is far below the fabric's). 400 Mbit/s is
#: ~0.05 GB/s, about a tenth of what the lab's fabric measures on a loaded 2-core machine (~0.5
#: GB/s), the ratio a Spark pair shows (23.7 GB/s over the QSFP link, 1-3 GB/s over 10 GbE).
MGMT_RATE = "400mbit"


@dataclass(frozen=True)
class Half:
    """One of the two fabric networks: its Docker network, bridge, subnet, and the netdev name in a
    node."""

    network: str
    bridge: str
    subnet: ipaddress.IPv4Network
    netdev: str


def halves(layout: Layout) -> tuple[Half, Half]:
    """The lab's two fabric networks: ``10.178.Y.0/24`` and ``10.179.Y.0/24`` for a lab on
    ``X.X.Y.0/24`` (``10.78.116.0/24`` -> ``10.178.116.0/24``, ``10.179.116.0/24``), private
    whatever the lab's subnet;
    two labs sharing Y are told so by :func:`ensure_networks` (the bridge exists)."""
    third = layout.subnet.network_address.packed[2]
    out = []
    for i, netdev in enumerate(SPARK_INTERFACES[:2]):
        subnet = ipaddress.IPv4Network(f"10.{178 + i}.{third}.0/24")
        out.append(
            Half(
                f"{layout.network}-fabric{i}",
                f"f{'ab'[i]}{subnet.network_address.packed.hex()}",
                subnet,
                netdev,
            )
        )
    return out[0], out[1]


def member_addresses(layout: Layout, index: int) -> list[str]:
    """Node ``index``'s fabric addresses, one per half (the same host number as on the lab
    network)."""
    host = int(ipaddress.IPv4Address(layout.node_address(index))) - int(
        layout.subnet.network_address
    )
    return [str(h.subnet.network_address + host) for h in halves(layout)]


def ensure_networks(layout: Layout, engine: Dockerd) -> None:
    """Create both fabric networks (MTU 9000, no gateway traffic, no masquerade) unless they
    exist."""
    have = engine.docker("network", "ls", "--format", "{{.Name}}").stdout.split()
    for h in halves(layout):
        if h.network in have:
            continue
        if Path(f"/sys/class/net/{h.bridge}").exists():
            raise FleetError(
                f"network interface {h.bridge} for the fabric subnet {h.subnet} already exists: "
                "another lab uses it",
                fix="pick another FLEETCTL_LAB_SUBNET, or `fleetctl lab down` the other lab",
            )
        engine.docker("network", "create", "--driver", "bridge", "--subnet", str(h.subnet),
                      "-o", f"com.docker.network.bridge.name={h.bridge}",
                      "-o", f"com.docker.network.driver.mtu={FABRIC_MTU}",
                      "-o", "com.docker.network.bridge.enable_ip_masquerade=false",
                      h.network, what=f"creating the lab fabric {h.subnet}")


def remove_networks(layout: Layout, engine: Dockerd) -> None:
    """Remove both fabric networks (after the nodes are gone)."""
    for h in halves(layout):
        engine.docker("network", "rm", h.network, check=False)


def attach(layout: Layout, engine: Dockerd, index: int) -> None:
    """Connect node ``index`` to both halves and give the new interfaces a Spark's names (MTU
    9000)."""
    name = layout.node_name(index)
    for h, addr in zip(halves(layout), member_addresses(layout, index), strict=True):
        r = exec_(engine, name, ["ip", "-o", "-4", "addr", "show", "to", addr], check=False)
        if h.netdev in r.stdout:
            continue  # attached and renamed already
        engine.docker(
            "network",
            "connect",
            "--ip",
            addr,
            h.network,
            name,
            what=f"attaching {name} to {h.network}",
        )
        # the interface Docker added is the one holding the address: rename it as a Spark names it
        exec_(
            engine,
            name,
            [
                "sh",
                "-c",
                f"dev=$(ip -o -4 addr show to {shlex.quote(addr)} | awk '{{print $2}}') && "
                f'ip link set "$dev" down && ip link set "$dev" name {h.netdev} && '
                f"ip link set {h.netdev} mtu {FABRIC_MTU} up",
            ],
            what=f"naming the fabric interface {h.netdev}",
        )


def install_tools(engine: Dockerd, name: str) -> None:
    """Install the stand-in ``ibdev2netdev`` and ``ibstat`` into node ``name``."""
    text = (
        Path(str(resources.files("fleetctl.lab") / "assets" / "fabric")) / "spark-rdma"
    ).read_text()
    write_file(engine, name, "/usr/local/lib/fleetctl-lab/spark-rdma", text)
    exec_(
        engine,
        name,
        [
            "sh",
            "-c",
            "chmod 755 /usr/local/lib/fleetctl-lab/spark-rdma && "
            "ln -sf /usr/local/lib/fleetctl-lab/spark-rdma /usr/local/bin/ibdev2netdev && "
            "ln -sf /usr/local/lib/fleetctl-lab/spark-rdma /usr/local/bin/ibstat",
        ],
        what="installing the stand-in ibdev2netdev and ibstat",
    )


def set_mtu(engine: Dockerd, name: str, mtu: int) -> None:
    """``--fabric-mtu N``: the first fabric netdev's MTU (1500 is the fault, 9000 the fix)."""
    if not 1280 <= mtu <= 9216:
        raise FleetError(
            f"--fabric-mtu {mtu} is not an MTU", host=name, fix="pass 1500 (the fault) or 9000"
        )
    exec_(
        engine,
        name,
        ["ip", "link", "set", SPARK_INTERFACES[0], "mtu", str(mtu)],
        what=f"setting the fabric MTU to {mtu}",
    )


def set_half_down(engine: Dockerd, name: str, down: bool) -> None:
    """``--fabric-down``: the second half's netdev down (its HCA reads Down), or up again."""
    exec_(engine, name, ["ip", "link", "set", SPARK_INTERFACES[1], "down" if down else "up"],
          what=f"taking {SPARK_INTERFACES[1]} {'down' if down else 'up'}")


def via_mgmt_script(peers: Sequence[tuple[str, str]], on: bool) -> str:
    """The sh commands routing each ``(peer fabric address, peer management address)`` over eth0
    (or back).

    Over eth0 the traffic to those addresses is shaped to MGMT_RATE (an htb class for them alone, so
    that SSH, pulls and the registry keep their speed); ``tc`` failing (no sch_htb) leaves the
    route alone.
    """
    lines = ["set -e"]
    for fabric_addr, mgmt_addr in peers:
        if on:
            lines.append(f"ip route replace {fabric_addr}/32 via {mgmt_addr} dev {MGMT_INTERFACE}")
        else:
            lines.append(
                f"ip route del {fabric_addr}/32 via {mgmt_addr} dev {MGMT_INTERFACE} 2>/dev/null "
                "|| true"
            )
    if on:
        lines += [
            f"tc qdisc replace dev {MGMT_INTERFACE} root handle 1: htb default 10 || exit 0",
            f"tc class replace dev {MGMT_INTERFACE} parent 1: classid 1:10 htb rate 100gbit",
            f"tc class replace dev {MGMT_INTERFACE} parent 1: classid 1:20 htb rate {MGMT_RATE}",
        ]
        lines += [
            f"tc filter add dev {MGMT_INTERFACE} parent 1: protocol ip prio 1 u32 match ip dst "
            f"{a}/32 flowid 1:20"
            for a, _ in peers
        ]
    else:
        lines.append(f"tc qdisc del dev {MGMT_INTERFACE} root 2>/dev/null || true")
    return "\n".join(lines) + "\n"


def set_via_mgmt(
    layout: Layout, engine: Dockerd, name: str, peers: Sequence[int], on: bool
) -> None:
    """``--fabric-via-mgmt``: node ``name`` reaches its unit peers (node indexes) over the
    management network."""
    pairs = [(member_addresses(layout, i)[0], layout.node_address(i)) for i in peers]
    exec_(engine, name, ["sh", "-c", via_mgmt_script(pairs, on)],
          what=f"routing the fabric {'over' if on else 'off'} the management network")
