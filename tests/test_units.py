"""Serving units in the inventory: members in rank order, each member's fabric, and the refusals."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from fleetctl import inventory
from fleetctl.errors import InventoryError

PAIR = """
all:
  children:
    sparks:
      hosts:
        spark-01: {ansible_host: 10.0.0.1}
        spark-07: {ansible_host: 10.0.0.7}
        spark-08: {ansible_host: 10.0.0.8}
      children:
        unit_pair_a:
          hosts:
            spark-07: {fleetctl_fabric: {addresses: [192.168.177.17]}}
            spark-08: {fleetctl_fabric: {addresses: [192.168.177.18, 192.168.178.18]}}
"""


def write(tmp: Path, text: str, group_vars: dict[str, str] | None = None) -> Path:
    # a new directory per inventory: ansible-core remembers, per process, a group_vars/ it found
    # missing
    tmp = Path(tempfile.mkdtemp(dir=tmp))
    p = tmp / "hosts.yml"
    p.write_text(text)
    for name, body in (group_vars or {}).items():
        (tmp / "group_vars").mkdir(exist_ok=True)
        (tmp / "group_vars" / f"{name}.yml").write_text(body)
    return p


def refusal(tmp: Path, text: str, group_vars: dict[str, str] | None = None) -> InventoryError:
    with pytest.raises(InventoryError) as e:
        inventory.load(write(tmp, text, group_vars))
    return e.value


def test_a_group_per_unit_with_spark_defaults(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, PAIR, {"unit_pair_a": "fleetctl_unit: pair-a\n"}))
    assert list(inv.units) == ["pair-a"]
    u = inv.units["pair-a"]
    assert (
        u.members == ("spark-07", "spark-08")
        and u.head == "spark-07"
        and u.workers == ("spark-08",)
    )
    f = u.fabric["spark-08"]
    assert f.interfaces == ("enp1s0f1np1", "enP2p1s0f1np1") and f.hcas == (
        "rocep1s0f1",
        "roceP2p1s0f1",
    )
    assert (f.address, f.interface, f.mtu) == ("192.168.177.18", "enp1s0f1np1", 9000)
    assert u.busbw_floor_gbs == inventory.SPARK_PAIR_BUSBW_FLOOR_GBS
    assert (inv.host("spark-08").unit, inv.host("spark-08").unit_rank) == ("pair-a", 1)
    assert inv.host("spark-01").unit is None and inv.unit_of("spark-01") is None
    assert inv.unit_of("spark-07") is u


def test_rank_order_from_the_variable(tmp_path: Path) -> None:
    gv = {"unit_pair_a": "fleetctl_unit: pair-a\nfleetctl_fabric_floor_gbs: 18\n"}
    text = PAIR.replace(
        "spark-07: {fleetctl_fabric", "spark-07: {fleetctl_unit_rank: 1, fleetctl_fabric"
    ).replace("spark-08: {fleetctl_fabric", "spark-08: {fleetctl_unit_rank: 0, fleetctl_fabric")
    u = inventory.load(write(tmp_path, text, gv)).units["pair-a"]
    assert u.members == ("spark-08", "spark-07") and u.busbw_floor_gbs == 18.0


def test_a_host_in_two_units_is_refused(tmp_path: Path) -> None:
    text = PAIR + """        unit_pair_b:
          hosts:
            spark-08:
            spark-01: {fleetctl_fabric: {addresses: [192.168.177.11]}}
"""
    e = refusal(
        tmp_path,
        text,
        {"unit_pair_a": "fleetctl_unit: pair-a\n", "unit_pair_b": "fleetctl_unit: pair-b\n"},
    )
    assert e.host == "spark-08" and "two units" in e.cause
    assert "unit_pair_a" in e.cause and "unit_pair_b" in e.cause and e.fix


def test_a_host_var_against_its_group_is_two_units(tmp_path: Path) -> None:
    text = PAIR.replace(
        "spark-08: {fleetctl_fabric", "spark-08: {fleetctl_unit: other, fleetctl_fabric"
    )
    e = refusal(tmp_path, text, {"unit_pair_a": "fleetctl_unit: pair-a\n"})
    assert e.host == "spark-08" and "'other' (its host vars)" in e.cause


def test_a_member_without_a_fabric_address_is_refused(tmp_path: Path) -> None:
    text = PAIR.replace(
        "spark-08: {fleetctl_fabric: {addresses: [192.168.177.18, 192.168.178.18]}}", "spark-08:"
    )
    e = refusal(tmp_path, text, {"unit_pair_a": "fleetctl_unit: pair-a\n"})
    assert e.host == "spark-08" and "no fabric address" in e.cause
    assert e.fix is not None and "fleetctl_fabric" in e.fix and "enp1s0f1np1" in e.fix


@pytest.mark.parametrize(("change", "words"), [
    ("[192.168.177.18, 192.168.178.18]", "not an IP address"),
    ("[10.0.0.8]", "management address"),
    ("[192.168.177.17]", "also spark-07's"),
])
def test_bad_fabric_addresses(tmp_path: Path, change: str, words: str) -> None:
    bad = {"not an IP address": "[192.168.177.18, fabric-b]"}.get(words, change)
    text = PAIR.replace("[192.168.177.18, 192.168.178.18]", bad)
    e = refusal(tmp_path, text, {"unit_pair_a": "fleetctl_unit: pair-a\n"})
    assert e.host == "spark-08" and words in e.cause, e.message()


@pytest.mark.parametrize(("fabric", "words"), [
    ("{addresses: [192.168.177.18], mtu: 90000}", "fleetctl_fabric.mtu"),
    ("{addresses: [192.168.177.18], interfaces: [eth0; rm]}", "fleetctl_fabric.interfaces"),
    ("{addresses: [192.168.177.18], speed: 9}", "fleetctl_fabric.speed is not a fabric field"),
    ("[192.168.177.18]", "must be a mapping"),
])
def test_bad_fabric_fields(tmp_path: Path, fabric: str, words: str) -> None:
    text = PAIR.replace("{addresses: [192.168.177.18, 192.168.178.18]}", fabric)
    e = refusal(tmp_path, text, {"unit_pair_a": "fleetctl_unit: pair-a\n"})
    assert e.host == "spark-08" and words in e.cause, e.message()


def test_a_unit_of_one_and_partial_ranks_are_refused(tmp_path: Path) -> None:
    one = PAIR.replace(
        "spark-07: {fleetctl_fabric", "spark-07: {fleetctl_unit: solo, fleetctl_fabric"
    )
    e = refusal(tmp_path, one)
    assert e.host == "spark-07" and "unit 'solo' has one member" in e.cause
    ranks = PAIR.replace(
        "spark-07: {fleetctl_fabric", "spark-07: {fleetctl_unit_rank: 0, fleetctl_fabric"
    )
    e = refusal(tmp_path, ranks, {"unit_pair_a": "fleetctl_unit: pair-a\n"})
    assert "not on spark-08" in e.cause
    dup = PAIR.replace("{fleetctl_fabric", "{fleetctl_unit_rank: 1, fleetctl_fabric")
    e = refusal(tmp_path, dup, {"unit_pair_a": "fleetctl_unit: pair-a\n"})
    assert "ranks [1, 1]" in e.cause
