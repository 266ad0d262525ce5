"""A unit's fabric and its members' parity, judged from what the tools print on a Spark.

Pure logic: parsers for ``ibdev2netdev``, ``ibstat``, ``ip -j link``/``ip -j addr``/``ip -j route
get`` and the NCCL tests' ``all_reduce_perf`` table, and the checks a unit must pass before any
change (docs/units.md): both HCAs of the port up at the expected rate, MTU 9000 on every fabric
netdev, each member's fabric address where the inventory says, the members reaching each other
through the fabric (not the management network), a measured all_reduce bus bandwidth above the
unit's floor, and every member on the same driver, kernel, DGX OS, Docker, container toolkit and
image.

Each failed check is a :class:`Finding` naming the member, the figure measured, the one expected
and the fix, e.g. ``spark-07: enp1s0f1np1 MTU 1500, expected 9000: set mtu 9000 in its netplan``.
How the outputs are gathered (one SSH round trip per member: :func:`member_probe_script`) is
separate from judging them, so that the same checks run on fixtures, the lab and a real fleet.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.inventory import Unit

_NETPLAN = "/etc/netplan (e.g. 40-cx7.yaml), then `sudo netplan apply`"


@dataclass(frozen=True)
class Finding:
    """One failed check: where, what was measured against what was expected, and the fix."""

    #: The member (or, for the bandwidth check, the unit) the finding is about.
    host: str
    check: str
    #: What was measured and expected, in a few words: ``enp1s0f1np1 MTU 1500, expected 9000``.
    what: str
    fix: str
    measured: Any = None
    expected: Any = None

    def message(self) -> str:
        """``host: what: fix``, the one line an operator reads."""
        return f"{self.host}: {self.what}: {self.fix}"

    def error(self) -> FleetError:
        """The finding as the FleetError a refusing command raises."""
        return FleetError(self.what, host=self.host, fix=self.fix)


# ---- parsers
# -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HcaLink:
    """One line of ``ibdev2netdev``: an RDMA device's port, its netdev and that netdev's state."""

    hca: str
    port: int
    netdev: str
    up: bool


_IBDEV = re.compile(
    r"^(?P<hca>\S+)\s+port\s+(?P<port>\d+)\s+==>\s+(?P<netdev>\S+)\s+\((?P<state>[^)]*)\)\s*$"
)


def parse_ibdev2netdev(text: str) -> dict[str, HcaLink]:
    """HCA name -> :class:`HcaLink` from ``ibdev2netdev`` (``rocep1s0f1 port 1 ==> enp1s0f1np1
    (Up)``)."""
    out: dict[str, HcaLink] = {}
    for line in text.splitlines():
        m = _IBDEV.match(line.strip())
        if m:
            out[m["hca"]] = HcaLink(
                m["hca"], int(m["port"]), m["netdev"], m["state"].strip().lower() == "up"
            )
    return out


@dataclass(frozen=True)
class IbPort:
    """Port 1 of an RDMA device as ``ibstat`` prints it."""

    hca: str
    state: str
    physical_state: str
    #: ``Rate:`` in Gb/s (0 when absent).
    rate_gbps: int
    link_layer: str

    @property
    def active(self) -> bool:
        """The port carries traffic: ``State: Active`` and ``Physical state: LinkUp``."""
        return self.state == "Active" and self.physical_state == "LinkUp"


def parse_ibstat(text: str) -> dict[str, IbPort]:
    """HCA name -> its first port from ``ibstat`` (the ``CA 'name'`` blocks, each with ``Port
    1:``)."""
    out: dict[str, IbPort] = {}
    hca: str | None = None
    fields: dict[str, str] = {}
    in_port = False

    def close() -> None:
        if hca is not None and hca not in out and fields:
            rate = re.match(r"\d+", fields.get("Rate", ""))
            out[hca] = IbPort(hca, fields.get("State", "?"), fields.get("Physical state", "?"),
                              int(rate.group()) if rate else 0, fields.get("Link layer", "?"))

    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"^CA '([^']+)'$", line)
        if m:
            close()
            hca, fields, in_port = m.group(1), {}, False
            continue
        if re.match(r"^Port \d+:$", line):
            if in_port:  # only the first port of a device (a Spark's HCAs have one)
                close()
                hca = None
            in_port = True
            continue
        if in_port and ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip()] = v.strip()
    close()
    return out


@dataclass(frozen=True)
class NetLink:
    """One netdev from ``ip -j addr`` (or ``ip -j link``): MTU, state, IPv4/IPv6 addresses."""

    ifname: str
    mtu: int
    operstate: str
    flags: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()

    @property
    def up(self) -> bool:
        """Administratively up with a carrier (``operstate`` UP, or flags UP and LOWER_UP)."""
        return self.operstate == "UP" or {"UP", "LOWER_UP"} <= set(self.flags)


def _json_list(text: str, what: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text or "[]")
    except ValueError:
        raise FleetError(f"{what} printed no JSON: {text.strip()[:120]!r}",
                         fix="install iproute2 5.x or newer (ip -j)") from None
    if not isinstance(data, list):
        raise FleetError(
            f"{what} printed {type(data).__name__}, not a list",
            fix="install iproute2 5.x or newer (ip -j)",
        )
    return [d for d in data if isinstance(d, dict)]


def parse_ip_links(text: str) -> dict[str, NetLink]:
    """ifname -> :class:`NetLink` from ``ip -j link`` or ``ip -j addr`` (the latter adds
    addresses)."""
    out: dict[str, NetLink] = {}
    for d in _json_list(text, "ip -j link"):
        name = str(d.get("ifname", ""))
        if not name:
            continue
        addrs = tuple(
            str(a["local"])
            for a in d.get("addr_info") or []
            if isinstance(a, dict) and a.get("local")
        )
        out[name] = NetLink(name, int(d.get("mtu") or 0), str(d.get("operstate", "UNKNOWN")),
                            tuple(str(f) for f in d.get("flags") or []), addrs)
    return out


def parse_route_get(text: str) -> str | None:
    """The netdev ``ip -j route get ADDRESS`` sends through (None when there is no route)."""
    routes = _json_list(text, "ip -j route get")
    return str(routes[0]["dev"]) if routes and routes[0].get("dev") else None


@dataclass(frozen=True)
class AllReduce:
    """The NCCL tests' ``all_reduce_perf`` table: bus bandwidth per size, wrong results."""

    #: (size in bytes, out-of-place busbw GB/s, in-place busbw GB/s) per row.
    rows: tuple[tuple[int, float, float], ...]
    #: ``# Avg bus bandwidth`` (GB/s), over every size including the tiny ones.
    avg_busbw_gbs: float | None
    #: Results NCCL found wrong (``#wrong`` columns, ``Out of bounds values``).
    wrong: int
    #: fleetctl's probe's per-link figures (``# link SENDER -> RECEIVER : X GB/s``, fabric
    #: addresses), slowest first.
    links: tuple[tuple[str, str, float], ...] = ()

    @property
    def peak_busbw_gbs(self) -> float:
        """The best bus bandwidth of the largest messages: the figure a link's reference is quoted
        in."""
        return max((max(o, i) for _, o, i in self.rows), default=0.0)


def parse_all_reduce(text: str) -> AllReduce:
    """Parse ``all_reduce_perf`` output (nccl-tests); raises when it holds no result row."""
    rows: list[tuple[int, float, float]] = []
    links: list[tuple[str, str, float]] = []
    wrong = 0
    avg: float | None = None
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"^#\s*link\s+(\S+)\s+->\s+(\S+)\s*:\s*([0-9.]+)\s*GB/s", line)
        if m:
            links.append((m.group(1), m.group(2), float(m.group(3))))
            continue
        m = re.match(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", line)
        if m:
            avg = float(m.group(1))
            continue
        m = re.match(r"^#\s*Out of bounds values\s*:\s*(\d+)", line)
        if m:
            wrong += int(m.group(1))
            continue
        if not line or line.startswith("#"):
            continue
        cols = line.split()
        # size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
        if len(cols) < 13 or not cols[0].isdigit():
            continue
        try:
            rows.append((int(cols[0]), float(cols[7]), float(cols[11])))
        except ValueError:
            continue
        wrong += sum(int(c) for c in (cols[8], cols[12]) if c.isdigit())
    if not rows:
        raise FleetError(
            f"all_reduce_perf printed no result row: {text.strip()[-200:]!r}",
            fix="run it by hand in the recipe's image on both members; its first error says why",
        )
    return AllReduce(tuple(rows), avg, wrong, tuple(sorted(links, key=lambda x: x[2])))


# ---- what one member reports
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberFabric:
    """What one member's tools printed, parsed (a tool that is missing leaves its part empty)."""

    hcas: Mapping[str, HcaLink] = field(default_factory=dict)
    ports: Mapping[str, IbPort] = field(default_factory=dict)
    links: Mapping[str, NetLink] = field(default_factory=dict)
    #: Peer fabric address -> the netdev this member routes it through (None: no route).
    routes: Mapping[str, str | None] = field(default_factory=dict)
    #: Tool -> why it could not be read (``ibstat: command not found``).
    missing: Mapping[str, str] = field(default_factory=dict)


_SECTION = "### fleetctl-fabric "


def member_probe_script(unit: Unit, host: str) -> str:
    """A POSIX sh script printing, in marked sections, everything :func:`check_member` judges.

    One SSH round trip per member; each tool's exit status is printed beside its output, so that a
    missing tool (no ibstat in a minimal install) is reported as such, never as a down port.
    """
    peers = [unit.fabric[m].address for m in unit.members if m != host]
    parts = [("ibdev2netdev", "ibdev2netdev"), ("ibstat", "ibstat"), ("ip-addr", "ip -j addr show")]
    parts += [(f"route {p}", f"ip -j route get {shlex.quote(p)}") for p in peers]
    lines = ["#!/bin/sh", "export LC_ALL=C"]
    for name, cmd in parts:
        # the status line starts on a line of its own even when the output does not end with one
        lines.append(
            f"echo '{_SECTION}{name}'; {cmd} 2>&1; printf '\\n{_SECTION}exit %s\\n' \"$?\""
        )
    return "\n".join(lines) + "\n"


def parse_member_probe(text: str) -> MemberFabric:
    """The :func:`member_probe_script` output, parsed into a :class:`MemberFabric`."""
    sections: dict[str, tuple[str, int]] = {}
    name: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith(_SECTION):
            tag = line[len(_SECTION):].strip()
            if tag.startswith("exit ") and name is not None:
                code = tag[5:].strip()
                sections[name] = ("\n".join(body), int(code) if code.isdigit() else 1)
                name, body = None, []
            else:
                name, body = tag, []
        elif name is not None:
            body.append(line)
    missing: dict[str, str] = {}

    def ok(key: str) -> str | None:
        got = sections.get(key)
        if got is None:
            missing[key] = "not run"
            return None
        out, code = got
        if code != 0:
            missing[key] = (out.strip().splitlines() or [f"exit status {code}"])[-1][:200]
            return None
        return out

    hcas = parse_ibdev2netdev(t) if (t := ok("ibdev2netdev")) is not None else {}
    ports = parse_ibstat(t) if (t := ok("ibstat")) is not None else {}
    links = parse_ip_links(t) if (t := ok("ip-addr")) is not None else {}
    routes: dict[str, str | None] = {}
    for key in [k for k in sections if k.startswith("route ")]:
        text, status = sections[key]
        routes[key[6:]] = parse_route_get(text) if status == 0 else None
    return MemberFabric(hcas, ports, links, routes, missing)


# ---- checks
# -------------------------------------------------------------------------------------------------


def check_member(unit: Unit, host: str, facts: MemberFabric, mgmt_interfaces: Iterable[str] = (),
                 mgmt_address: str | None = None) -> list[Finding]:
    """Every fabric check of one member: netdevs up at MTU, its address in place, both HCAs active
    at the expected rate, and each peer reached through a fabric netdev. A route through a
    management netdev (``mgmt_interfaces``, or the one holding ``mgmt_address``, the address
    fleetctl reaches the
    host at) is called the management network."""
    f = unit.fabric[host]
    out: list[Finding] = []
    mgmt = set(mgmt_interfaces) | {
        n for n, x in facts.links.items() if mgmt_address and mgmt_address in x.addresses
    }
    for tool, why in facts.missing.items():
        if tool.startswith("route "):
            continue
        out.append(
            Finding(
                host,
                f"tool {tool}",
                f"{tool} could not be read ({why})",
                "install the DGX OS networking tools (rdma-core, infiniband-diags, iproute2) on "
                "the member"
                if tool != "ip-addr"
                else "install iproute2 (ip -j)",
            )
        )
    if "ip-addr" not in facts.missing:
        for i, ifname in enumerate(f.interfaces):
            link = facts.links.get(ifname)
            if link is None:
                out.append(
                    Finding(
                        host,
                        "netdev",
                        f"no netdev {ifname} (it has: {', '.join(sorted(facts.links)) or 'none'})",
                        "correct fleetctl_fabric.interfaces (ibdev2netdev lists the QSFP netdevs)",
                        None,
                        ifname,
                    )
                )
                continue
            if not link.up:
                out.append(
                    Finding(
                        host,
                        "netdev",
                        f"{ifname} is {link.operstate}, expected UP",
                        f"check the QSFP cable in the port of {ifname} and `ip link set {ifname} "
                        "up`",
                        link.operstate,
                        "UP",
                    )
                )
            if link.mtu != f.mtu:
                out.append(
                    Finding(
                        host,
                        "mtu",
                        f"{ifname} MTU {link.mtu}, expected {f.mtu}",
                        f"set mtu {f.mtu} in its netplan ({_NETPLAN}), on every member",
                        link.mtu,
                        f.mtu,
                    )
                )
            if i < len(f.addresses) and f.addresses[i] not in link.addresses:
                where = [n for n, x in facts.links.items() if f.addresses[i] in x.addresses]
                now = (
                    f"it is on {where[0]}"
                    if where
                    else f"{ifname} has {', '.join(link.addresses) or 'no address'}"
                )
                out.append(
                    Finding(
                        host,
                        "address",
                        f"fabric address {f.addresses[i]} is not on {ifname} ({now})",
                        f"give {ifname} the address {f.addresses[i]} in its netplan ({_NETPLAN}), "
                        "or correct "
                        f"fleetctl_fabric.addresses",
                        link.addresses,
                        f.addresses[i],
                    )
                )
    if "ibdev2netdev" not in facts.missing or "ibstat" not in facts.missing:
        for hca in f.hcas:
            hl = facts.hcas.get(hca)
            port = facts.ports.get(hca)
            if hl is None and port is None:
                out.append(
                    Finding(
                        host,
                        "hca",
                        f"no RDMA device {hca} (it has: {', '.join(sorted(facts.hcas)) or 'none'})",
                        "correct fleetctl_fabric.hcas (ibdev2netdev lists them), or load the mlx5 "
                        "driver",
                        None,
                        hca,
                    )
                )
                continue
            half = f"{hca}{f' ({hl.netdev})' if hl else ''}"
            if (hl is not None and not hl.up) or (port is not None and not port.active):
                state = port.physical_state if port is not None else "Down"
                out.append(
                    Finding(
                        host,
                        "hca",
                        f"{half} is {state}, expected Active/LinkUp: NCCL gets half the "
                        f"port's bandwidth or falls back to sockets",
                        f"seat the QSFP cable in the port of {hl.netdev if hl else hca} on both "
                        "members "
                        f"and keep both halves in NCCL_IB_HCA",
                        state,
                        "LinkUp",
                    )
                )
            elif port is not None and port.rate_gbps < f.rate_gbps:
                out.append(
                    Finding(
                        host,
                        "rate",
                        f"{half} at {port.rate_gbps} Gb/s, expected {f.rate_gbps}",
                        "use a cable rated for 200G (NVIDIA's approved QSFP56 DAC) and check both "
                        "ends",
                        port.rate_gbps,
                        f.rate_gbps,
                    )
                )
    fabric_ifs = set(f.interfaces)
    for peer in unit.members:
        if peer == host:
            continue
        addr = unit.fabric[peer].address
        if addr not in facts.routes:
            continue
        dev = facts.routes[addr]
        if dev is None:
            out.append(
                Finding(
                    host,
                    "route",
                    f"no route to {peer}'s fabric address {addr}",
                    f"put both members' fabric addresses in one subnet on {f.interface} "
                    f"({_NETPLAN})",
                    None,
                    f.interface,
                )
            )
        elif dev not in fabric_ifs:
            via = " (the management network)" if dev in mgmt else ""
            out.append(
                Finding(
                    host,
                    "route",
                    f"traffic to {peer}'s fabric address {addr} leaves through {dev}{via}, "
                    f"not {f.interface}: 10-20x slower",
                    f"give {f.interface} an address in {peer}'s fabric subnet and remove the route "
                    "through "
                    f"{dev} ({_NETPLAN})",
                    dev,
                    f.interface,
                )
            )
    return out


def check_bandwidth(unit: Unit, result: AllReduce) -> list[Finding]:
    """The measured all_reduce bus bandwidth against the unit's floor, and NCCL's own wrong results.

    With fleetctl's probe's per-link figures, a bandwidth below the floor is the slowest link's
    sender's
    finding (the member whose traffic leaves the wrong way), naming that link; else the unit's."""
    out: list[Finding] = []
    peak = result.peak_busbw_gbs
    by_address = {f.address: m for m, f in unit.fabric.items()}
    slow = result.links[0] if result.links else None
    where, link = unit.name, ""
    if slow is not None and slow[0] in by_address:
        where = by_address[slow[0]]
        link = (
            f" (unit {unit.name}; the slowest link {where} -> {by_address.get(slow[1], slow[1])} "
            f"measured {_gbs(slow[2])} GB/s)"
        )
    if result.wrong:
        out.append(
            Finding(
                unit.name,
                "nccl",
                f"all_reduce_perf found {result.wrong} wrong result(s)",
                "the fabric corrupts data or the members' NCCL builds differ: compare the members' "
                "images and NCCL versions, and reseat the cable",
                result.wrong,
                0,
            )
        )
    if peak < unit.busbw_floor_gbs:
        out.append(
            Finding(
                where,
                "bandwidth",
                f"all_reduce bus bandwidth {_gbs(peak)} GB/s, expected at least "
                f"{_gbs(unit.busbw_floor_gbs)}{link}",
                "check that both HCAs are up (ibdev2netdev), MTU is 9000 on both ends, and the "
                "members reach "
                "each other over the QSFP addresses, not the management network (`ip route get "
                "PEER` on "
                f"{where if link else 'each member'}; fleetctl status shows the fabric); or lower "
                "fleetctl_fabric_floor_gbs for this unit",
                round(peak, 3),
                unit.busbw_floor_gbs,
            )
        )
    return out


def _gbs(value: float) -> str:
    """A bandwidth in GB/s to the figure that tells it apart: 23.7, 3.1, 0.42, 0.025."""
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}" if value >= 0.1 else f"{value:.3f}"


#: What every member of a unit must agree on, and the fix when one differs.
PARITY_FIELDS: Mapping[str, str] = {
    "driver": "install the same NVIDIA driver on every member (fleetctl provision reports each "
              "host's)",
    "kernel": "boot every member into the same kernel (apt hold it; check /boot's default entry)",
    "dgx_release": "upgrade every member to the same DGX OS release",
    "docker": "install the same Docker version on every member",
    "toolkit": "pin the same nvidia-container-toolkit on every member (fleetctl provision installs "
               "the pinned one)",
    "image_digest": "pull the same image digest on every member (a rollout starts every member by "
                    "digest)",
}


def check_parity(unit: Unit, facts: Mapping[str, Mapping[str, str | None]],
                 fields: Sequence[str] = tuple(PARITY_FIELDS)) -> list[Finding]:
    """Every member against the head on each field (driver, kernel, DGX OS, Docker, toolkit, image
    digest).

    ``facts`` is member -> field -> value. A value that could not be read is a finding too (never
    assumed equal); the head is the reference, so a differing head shows up on every worker.
    """
    out: list[Finding] = []
    head = unit.head
    for name in fields:
        ref = facts.get(head, {}).get(name)
        for m in unit.members:
            value = facts.get(m, {}).get(name)
            label = name.replace("_", " ")
            if value is None:
                out.append(
                    Finding(
                        m,
                        f"parity {name}",
                        f"{label} unknown (the probe could not read it)",
                        "run `fleetctl status` on the unit to see why",
                        None,
                        ref,
                    )
                )
            elif m != head and ref is not None and value != ref:
                out.append(
                    Finding(
                        m,
                        f"parity {name}",
                        f"{label} {value}, the head {head} has {ref}",
                        PARITY_FIELDS.get(name, "make every member of the unit the same"),
                        value,
                        ref,
                    )
                )
    return out


# ---- what a member's log says about its collectives
# ------------------------------------------------------------

#: Markers of NCCL's, Gloo's and torch.distributed's own error and timeout lines.
_COLLECTIVE = re.compile(
    r"NCCL WARN|NCCL "
    r"error|ncclRemoteError|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|"
    r"ProcessGroupNCCL|Watchdog caught collective operation "
    r"timeout|DistBackendError|DistNetworkError|"
    r"DistStoreError|gloo/transport|Gloo connectFullMesh|communicator was aborted|NET/IB : "
    r"|NET/Socket : "
)


def collective_errors(log: str, most: int = 20) -> list[str]:
    """The lines of a member's log where NCCL, Gloo or torch.distributed report an error or a
    timeout (the last ``most``, each cut to 300 characters): quoted as the cause when a unit wedges
    or
    dies."""
    out = [
        line.strip()[:300]
        for line in log.splitlines()
        if _COLLECTIVE.search(line) and " NCCL INFO " not in line
    ]  # NCCL's INFO lines name no error
    return out[-most:]
