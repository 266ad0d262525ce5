"""``fleetctl soak baseline``'s tables: the hosts' throughput windows and the recipes' known-good
reference sets (soak/references.py), as rich tables and JSON."""

from __future__ import annotations

from collections.abc import Callable

import click
from rich.console import Console

from fleetctl.cli.output import Col, fit_table
from fleetctl.soak import baselines, references


def render_windows(ws: list[baselines.Window]) -> Callable[[Console], None]:
    def render(out: Console) -> None:
        rows = []
        for w in ws:
            b = w.baseline
            assert b is not None
            peak = max(
                (lv for lv in b.levels if lv.phase == "sweep" and lv.tok_s),
                key=lambda lv: lv.tok_s or 0.0,
                default=None,
            )
            spread = b.baseline_spread.get(peak.label) if peak else None
            rows.append([w.host, w.tag, str(len(w.runs)), "yes" if w.pinned else "no",
                         f"{peak.tok_s:.0f} ({peak.label})" if peak and peak.tok_s else "-",
                         f"{spread:.1f}" if spread is not None else "-", w.runs[-1].finished[:19]])
        out.print(
            fit_table(
                out.width,
                [
                    "host",
                    Col("tag", flex=True, min=12),
                    "runs",
                    "pinned",
                    Col("peak tok/s", drop=2),
                    Col("spread", drop=1),
                    Col("newest", drop=3),
                ],
                rows,
                title="soak baselines",
            )
        )
        if not ws:
            out.print(
                "no baseline recorded: a passing `fleetctl soak` (or rollout gate) records one"
            )

    return render


def window_json(w: baselines.Window) -> dict[str, object]:
    b = w.baseline
    return {
        "host": w.host,
        "tag": w.tag,
        "pinned": w.pinned,
        "runs": [r.run_id for r in w.runs],
        "fingerprint": w.runs[-1].fingerprint if w.runs else None,
        "levels": {}
        if b is None
        else {
            lv.label: {"tok_s": lv.tok_s, "spread": b.baseline_spread.get(lv.label)}
            for lv in b.levels
            if lv.phase == "sweep"
        },
    }


#: ``--known-good RECIPE`` on ``baseline show|pin|reset``: act on the recipe's reference sets.
known_good_option = click.option(
    "--known-good", "known_good", metavar="RECIPE",
    help="The recipe's known-good reference sets (greedy answers) instead of hosts' windows; "
         "RECIPE@HARDWARE for a fleetctl_hardware class.")


def refs_of(store: baselines.Store, recipe: str) -> list[dict[str, object]]:
    """The reference sets kept for ``recipe`` (every hardware class of it; ``all``: every recipe)
    as JSON: key, pinned, and each set's version, digest, run and answers' finish/tokens/loop."""
    out: list[dict[str, object]] = []
    for key in references.keys(store):
        name = key[len(references.PREFIX):]
        if recipe not in ("all", name, name.split("@")[0]):
            continue
        sets, pinned = references.history(store, key)
        out.append({"key": key, "pinned": pinned, "sets": [
            {"version": s.version, "tag": s.tag, "digest": s.digest, "run_id": s.run_id,
             "host": s.host, "recorded": s.recorded, "fingerprint": s.fingerprint,
             "answers": [{"id": a.id, "finish_reason": a.finish_reason, "tokens": a.tokens,
                          "loop": a.loop} for a in s.answers]} for s in sets]})
    return out


def render_refs(refs: list[dict[str, object]]) -> Callable[[Console], None]:
    """The reference sets as a table: the newest set of each key is the known-good."""

    def render(out: Console) -> None:
        rows = []
        for r in refs:
            sets = r["sets"]
            assert isinstance(sets, list)
            for i, s in enumerate(sets):
                answers = s["answers"]
                stops = sum(a["finish_reason"] == "stop" for a in answers)
                rows.append([str(r["key"]), str(s["tag"] or s["version"]),
                             "known-good" if i == len(sets) - 1 else "older",
                             "yes" if r["pinned"] else "no", f"{stops}/{len(answers)}",
                             str(s["run_id"]), str(s["recorded"])[:19]])
        out.print(fit_table(out.width, [
            "recipe", Col("version", flex=True, min=12), "role", "pinned", Col("stops", drop=2),
            Col("run", drop=1, flex=True), Col("recorded", drop=3)], rows,
            title="known-good reference sets"))
        if not refs:
            out.print("no reference set recorded: a passing full soak of the recipe records one")

    return render
