"""Soak reports: JSON, JUnit XML (one test case per host and check) and one self-contained HTML
file.

The HTML report has inline SVG charts, no scripts and no external assets, so
it opens from a CI artifact store as it is: aggregate tok/s and TTFT against
concurrency, acceptance per window over time, TTFT and TPOT distributions,
each drawn against the baseline when there is one.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetctl import paths, serving
from fleetctl.errors import FleetError
from fleetctl.soak.checks.judge import ms, pct
from fleetctl.soak.verdict import Outcome, Verdict, to_dict

COLORS = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#9a6700", "error": "#8250df",
          "skipped": "#6e7781"}
_SERIES = ("#0969da", "#bc4c00", "#1a7f37", "#8250df", "#cf222e", "#6e7781")


def _write(path: Path, text: str) -> None:
    paths.write_private(Path(path), text)


def check_writable(option: str, name: str | None) -> None:
    """Refuse a report path ``name`` that :func:`_write` could not write, before any traffic: a
    directory, something not a regular file, a parent that is a file, or a directory no file can be
    made in (a probe file is made there and removed). A missing parent is made by the write, so its
    nearest existing ancestor is what is tried."""
    if not name:
        return
    path = Path(name)
    fix = f"give {option} a file in a directory you can write (e.g. {option} ./soak-report)"
    if name.endswith(("/", os.sep)) or path.is_dir():
        raise FleetError(f"{option} {name} is a directory, not a file", fix=fix)
    if path.exists() and not path.is_file():
        raise FleetError(f"{option} {name} exists and is not a regular file (the report "
                         "replaces it)", fix=fix)
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise FleetError(f"{option} {name}: {parent} is not a directory", fix=fix)
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
    except OSError as e:
        raise FleetError(f"{option} {name} cannot be written: {e.strerror or e} in {parent}",
                         fix=fix) from None
    os.close(fd)
    os.unlink(probe)


def check_report_paths(json_file: str | None, junit_file: str | None, html_file: str | None,
                       json_option: str = "--json-report") -> None:
    """:func:`check_writable` for each report option given (the soak's and the watch's)."""
    for option, name in ((json_option, json_file), ("--junit", junit_file), ("--html", html_file)):
        check_writable(option, name)


def to_json(verdicts: Sequence[Verdict]) -> str:
    """Every verdict as JSON: ``{"outcome": worst, "verdicts": [...]}``, and ``"healed"``: the
    hosts a watch's remediations healed (only when there are some)."""
    out: dict[str, Any] = {"outcome": worst(verdicts).value}
    healed = [v.target for v in verdicts if v.healed]
    if healed:
        out["healed"] = healed
    out["verdicts"] = [to_dict(v) for v in verdicts]
    return json.dumps(out, indent=2)


def worst(verdicts: Sequence[Verdict]) -> Outcome:
    """The fleet's outcome: any fail, else any error, else any inconclusive, else pass."""
    outs = {v.outcome for v in verdicts}
    for o in (Outcome.FAIL, Outcome.ERROR, Outcome.INCONCLUSIVE):
        if o in outs:
            return o
    return Outcome.PASS if verdicts else Outcome.INCONCLUSIVE


def write_json(path: Path, verdicts: Sequence[Verdict]) -> None:
    """Write :func:`to_json` atomically."""
    _write(path, to_json(verdicts) + "\n")


def to_junit(verdicts: Sequence[Verdict]) -> str:
    """JUnit XML: a suite per host, a test case per check.

    fail -> <failure>, error and inconclusive -> <error type=...> (neither is a pass),
    skipped -> <skipped>; observe-only checks pass with their outcome in system-out.
    """
    root = ET.Element("testsuites", name="fleetctl soak")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for v in verdicts:
        suite = ET.SubElement(root, "testsuite", name=f"soak {v.target}", timestamp=v.started,
                              hostname=v.target)
        props = ET.SubElement(suite, "properties")
        for k, val in (
            ("run_id", v.run_id),
            ("base_url", v.base_url),
            ("tag", v.tag),
            ("digest", v.digest),
            ("version", v.version),
            ("outcome", v.outcome.value),
            ("artifacts", v.artifacts_dir or ""),
            ("baseline", v.baseline_run_id),
        ):
            ET.SubElement(props, "property", name=k, value=str(val))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for c in v.checks:
            case = ET.SubElement(suite, "testcase", classname=f"soak.{v.target}", name=c.name)
            counts["tests"] += 1
            detail = "\n".join(f"{m.outcome.value:12} {m.message}" for m in c.measurements)
            if c.observe_only:
                ET.SubElement(
                    case, "system-out"
                ).text = f"observe-only: {c.outcome.value}: {c.message}\n{detail}"
            elif c.outcome is Outcome.FAIL:
                ET.SubElement(case, "failure", message=c.message, type="fail").text = detail
                counts["failures"] += 1
            elif c.outcome in (Outcome.ERROR, Outcome.INCONCLUSIVE):
                ET.SubElement(case, "error", message=c.message, type=c.outcome.value).text = detail
                counts["errors"] += 1
            elif c.outcome is Outcome.SKIPPED:
                ET.SubElement(case, "skipped", message=c.message)
                counts["skipped"] += 1
            else:
                ET.SubElement(case, "system-out").text = c.message + (
                    "\n" + detail if detail else ""
                )
        for k, n in counts.items():
            suite.set(k, str(n))
            totals[k] += n
        suite.set("time", f"{v.seconds:.1f}")
    for k, n in totals.items():
        root.set(k, str(n))
    _xml_safe(root)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


#: Characters XML 1.0 forbids even escaped: C0 controls but tab/newline/CR, surrogates,
#: U+FFFE/U+FFFF.
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(s: str) -> str:
    """``s`` with every character XML 1.0 cannot hold shown as ``\\xNN`` (a boot log's ANSI colours,
    a NUL from a crashed process): ElementTree writes them as they are and the file is then
    invalid."""
    return _XML_INVALID.sub(lambda m: f"\\x{ord(m.group()):02x}", s)


def _xml_safe(root: ET.Element) -> None:
    for el in root.iter():
        if el.text:
            el.text = xml_text(el.text)
        if el.tail:
            el.tail = xml_text(el.tail)
        for k, v in el.attrib.items():
            el.set(k, xml_text(v))


def write_junit(path: Path, verdicts: Sequence[Verdict]) -> None:
    """Write :func:`to_junit` atomically."""
    _write(path, to_junit(verdicts))


# --- SVG ----------------------------------------------------------------------------------------

Point = tuple[float, float]

# Presentation attributes rather than CSS classes: the charts look the same inside the page,
# saved on their own, or in a viewer that ignores the page's stylesheet.
_FONT = 'font-family="sans-serif" font-size="11" fill="#1f2328"'
_T = 'font-family="sans-serif" font-size="13" font-weight="600" fill="#1f2328"'
_AX = 'stroke="#57606a"'
_GRID = 'stroke="#eaeef2"'
_XL = _FONT + ' text-anchor="middle"'
_YL = _FONT + ' text-anchor="end"'


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if v <= m * exp:
            return float(m * exp)
    return float(10 * exp)


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 or v == 0 else f"{v:.2g}"


def line_chart(
    title: str,
    series: Sequence[tuple[str, Sequence[Point], bool]],
    x_label: str,
    y_label: str,
    x_ticks: Sequence[tuple[float, str]] | None = None,
    y_fmt: str = "num",
) -> str:
    """An SVG line chart; each series is (name, points, dashed). Empty series are dropped."""
    W, H, L, R, T, B = 560, 280, 60, 150, 30, 40
    pts = [p for _n, s, _d in series for p in s]
    if not pts:
        return f'<div class="empty">{html.escape(title)}: no data</div>'
    xmin = min(p[0] for p in pts)
    xmax = max(p[0] for p in pts)
    if x_ticks:
        xmin, xmax = min(xmin, *(t for t, _ in x_ticks)), max(xmax, *(t for t, _ in x_ticks))
    if xmax == xmin:
        xmax = xmin + 1
    ymax = _nice_max(max(p[1] for p in pts) * 1.05)

    def sx(x: float) -> float:
        return L + (x - xmin) / (xmax - xmin) * (W - L - R)

    def sy(y: float) -> float:
        return H - B - y / ymax * (H - T - B)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        f'role="img" aria-label="{html.escape(title)}">',
        f'<text x="{L}" y="18" {_T}>{html.escape(title)}</text>',
        f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" {_AX}/>',
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" {_AX}/>',
    ]
    for i in range(5):
        y = ymax * i / 4
        label = pct(y) if y_fmt == "pct" else _fmt(y)
        out.append(f'<line x1="{L}" y1="{sy(y):.1f}" x2="{W - R}" y2="{sy(y):.1f}" {_GRID}/>'
                   f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" {_YL}>{label}</text>')
    ticks = x_ticks or [
        (xmin + (xmax - xmin) * i / 4, _fmt(xmin + (xmax - xmin) * i / 4)) for i in range(5)
    ]
    for x, lab in ticks:
        out.append(f'<text x="{sx(x):.1f}" y="{H - B + 16}" {_XL}>{html.escape(lab)}</text>')
    out.append(f'<text x="{(L + W - R) / 2:.0f}" y="{H - 6}" {_XL}>{html.escape(x_label)}</text>')
    out.append(
        f'<text x="14" y="{(T + H - B) / 2:.0f}" {_FONT} text-anchor="middle" '
        'transform="rotate(-90 14 '
        f'{(T + H - B) / 2:.0f})">{html.escape(y_label)}</text>'
    )
    for i, (name, s, dashed) in enumerate(x for x in series if x[1]):
        color = _SERIES[i % len(_SERIES)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
        )
        out.extend(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in s
        )
        ly = T + 14 + i * 18
        out.append(
            f'<line x1="{W - R + 10}" y1="{ly - 4}" x2="{W - R + 30}" y2="{ly - 4}" '
            f'stroke="{color}" '
            f'stroke-width="2"{dash}/><text x="{W - R + 34}" y="{ly}" '
            f'{_FONT}>{html.escape(name)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def histogram(
    title: str, series: Sequence[tuple[str, Sequence[float]]], x_label: str, bins: int = 24
) -> str:
    """An SVG histogram of durations (seconds, drawn in ms); series are overlaid as step lines."""
    vals = [v for _n, s in series for v in s]
    if not vals:
        return f'<div class="empty">{html.escape(title)}: no data</div>'
    hi = sorted(vals)[max(0, int(len(vals) * 0.99) - 1)] or max(vals) or 1.0
    width = hi / bins
    curves: list[tuple[str, Sequence[Point], bool]] = []
    for i, (name, s) in enumerate(series):
        if not s:
            continue
        counts = [0] * bins
        for v in s:
            counts[min(int(v / width), bins - 1)] += 1
        n = len(s)
        curves.append(
            (
                f"{name} (n={n})",
                [((k + 0.5) * width * 1000, c / n) for k, c in enumerate(counts)],
                i > 0,
            )
        )
    return line_chart(title, curves, x_label, "share of requests", y_fmt="pct")


# --- HTML ---------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1f2328;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #d0d7de;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f6f8fa}.o{font-weight:600;color:#fff;padding:2px 6px;border-radius:4px}
.charts{display:flex;flex-wrap:wrap;gap:16px}svg{background:#fff;border:1px solid #d0d7de}
.t{font-weight:600;font-size:13px}.ax{stroke:#57606a}.grid{stroke:#eaeef2}.xl{font-size:11px;text-anchor:middle}
.yl{font-size:11px;text-anchor:end}.lg{font-size:11px}.empty{color:#6e7781;padding:8px}.m{color:#57606a}
"""  # noqa: E501 (data: lines as the program reads them)


def _badge(o: Outcome) -> str:
    return f'<span class="o" style="background:{COLORS[o.value]}">{o.value}</span>'


def _levels_table(v: Verdict) -> str:
    rows = [
        "<tr><th>phase</th><th>level</th><th>c</th><th>requests</th><th>errors</th><th>tok/s</th>"
        "<th>TTFT p50</th><th>TTFT p95</th><th>TPOT p50</th><th>first error</th></tr>"
    ]
    for lv in v.levels:
        rows.append(
            f"<tr><td>{lv.phase}</td><td>{html.escape(lv.label)}</td><td>{lv.concurrency}</td>"
            f"<td>{lv.requests}</td><td>{lv.errors}</td>"
            f"<td>{'' if lv.tok_s is None else f'{lv.tok_s:.1f}'}</td><td>{ms(lv.ttft_p50)}</td>"
            f"<td>{ms(lv.ttft_p95)}</td><td>{ms(lv.tpot_p50)}</td>"
            f"<td>{html.escape(lv.first_error[:160])}</td></tr>"
        )
    return "<table>" + "".join(rows) + "</table>"


def _windows_table(v: Verdict) -> str:
    rows = [
        "<tr><th>window</th><th>seconds</th><th>gen tok/s</th><th>acceptance</th><th>mean acc. "
        "length</th>"
        "<th>per position</th><th>finished by reason</th><th>preemptions</th><th>KV max</th></tr>"
    ]
    for w in v.windows:
        reasons = ", ".join(f"{k} {val:.0f}" for k, val in w.success_by_reason.items() if val)
        rows.append(
            f"<tr><td>{html.escape(w.label)}{' (reset)' if w.counter_reset else ''}</td>"
            f"<td>{w.end - w.start:.1f}</td>"
            f"<td>{'' if w.generation_tok_s is None else f'{w.generation_tok_s:.1f}'}</td>"
            f"<td>{pct(w.acceptance_rate)}</td>"
            f"<td>{'' if w.mean_acceptance_length is None else f'{w.mean_acceptance_length:.2f}'}"
            "</td>"
            f"<td>{' '.join(pct(p) for p in w.per_position)}</td><td>{html.escape(reasons)}</td>"
            f"<td>{'' if w.preemptions is None else f'{w.preemptions:.0f}'}</td>"
            f"<td>{pct(w.kv_cache_usage_max)}</td></tr>"
        )
    return "<table>" + "".join(rows) + "</table>"


def _charts(v: Verdict, base: Verdict | None) -> str:
    sweep = [lv for lv in v.levels if lv.phase == "sweep"]
    bsweep = [lv for lv in base.levels if lv.phase == "sweep"] if base else []
    levels = sorted({lv.concurrency for lv in (*sweep, *bsweep)})
    idx = {c: float(i) for i, c in enumerate(levels)}
    ticks = [(idx[c], f"c={c}") for c in levels]

    def pts(lvs: Sequence[object], attr: str, scale: float = 1.0) -> list[Point]:
        out: list[Point] = []
        for lv in lvs:
            val = getattr(lv, attr)
            if val is not None:
                out.append((idx[lv.concurrency], val * scale))  # type: ignore[attr-defined]
        return out

    bname = "baseline" if base else ""
    charts = [
        line_chart(
            "Aggregate throughput vs concurrency",
            [("this soak", pts(sweep, "tok_s"), False), (bname, pts(bsweep, "tok_s"), True)],
            "concurrency",
            "output tok/s",
            ticks,
        ),
        line_chart(
            "TTFT vs concurrency",
            [
                ("p50", pts(sweep, "ttft_p50", 1000), False),
                ("p95", pts(sweep, "ttft_p95", 1000), False),
                (f"{bname} p95" if base else "", pts(bsweep, "ttft_p95", 1000), True),
            ],
            "concurrency",
            "ms",
            ticks,
        ),
    ]
    acc = [
        ((w.start + w.end) / 2, w.acceptance_rate)
        for w in v.windows
        if w.acceptance_rate is not None
    ]
    bacc = [((w.start + w.end) / 2, w.acceptance_rate) for w in base.windows
            if w.acceptance_rate is not None] if base else []
    charts.append(line_chart("Draft acceptance per window over the soak",
                             [("this soak", [(x, y) for x, y in acc if y is not None], False),
                              (bname, [(x, y) for x, y in bacc if y is not None], True)],
                             "seconds since start", "acceptance rate", y_fmt="pct"))
    charts.append(histogram("TTFT distribution", [("this soak", v.ttft_samples),
                                                  (bname, base.ttft_samples if base else ())],
                            "TTFT (ms; the last bin holds p99 and above)"))
    charts.append(histogram("TPOT distribution", [("this soak", v.tpot_samples),
                                                  (bname, base.tpot_samples if base else ())],
                            "TPOT (ms; the last bin holds p99 and above)"))
    return '<div class="charts">' + "".join(charts) + "</div>"


_HEX64 = re.compile(r"(?:sha256:)?[0-9a-f]{64}")


def shown_tag(v: Verdict) -> str:
    """The version as people name it: ``2026-07-01-v0.24.0 @0123456789ab`` (tag and short digest, as
    ``fleetctl status`` shows them); a tag that is itself a digest (a verdict made before soaks read
    the fleetctl.tag label) is shortened too."""
    tag, digest = v.tag, v.digest
    if _HEX64.fullmatch(tag):
        tag, digest = "", digest or tag
    short = serving.short_digest(digest)
    return " ".join(x for x in (tag, f"@{short}" if short else "") if x) or "-"


def to_html(verdicts: Sequence[Verdict], baselines: dict[str, Verdict] | None = None) -> str:
    """One self-contained HTML page for the soaks of several hosts."""
    baselines = baselines or {}
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>fleetctl soak "
        "report</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>fleetctl soak {_badge(worst(verdicts))}</h1>",
        "<table><tr><th>host</th><th>outcome</th><th>tag</th><th>version</th><th>summary</th><th>run</th></tr>",
    ]
    for v in verdicts:
        parts.append(
            f"<tr><td><a href='#{html.escape(v.target)}'>{html.escape(v.target)}</a></td>"
            f"<td>{_badge(v.outcome)}</td><td "
            f"class='m'>{html.escape(shown_tag(v))}</td><td>{html.escape(v.version)}</td>"
            f"<td>{html.escape(v.summary)}</td><td class='m'>{html.escape(v.run_id)}</td></tr>"
        )
    parts.append("</table>")
    for v in verdicts:
        base = baselines.get(v.target)
        parts.append(
            f"<h2 id='{html.escape(v.target)}'>{html.escape(v.target)} {_badge(v.outcome)}</h2>"
        )
        parts.append(
            f"<p class='m'>{html.escape(v.base_url)} · profile {html.escape(v.profile)} · "
            f"{v.started} · {v.seconds:.0f}s · run {html.escape(v.run_id)}"
            + (
                f" · baseline {html.escape(v.baseline_run_id)}"
                if v.baseline_run_id
                else " · no baseline"
            )
            + (f" · artifacts {html.escape(v.artifacts_dir)}" if v.artifacts_dir else "")
            + "</p>"
        )
        parts.append("<table><tr><th>check</th><th>outcome</th><th>result</th></tr>")
        for c in v.checks:
            obs = " <span class='m'>(observe only)</span>" if c.observe_only else ""
            parts.append(f"<tr><td>{c.name}{obs}</td><td>{_badge(c.outcome)}</td>"
                         f"<td>{html.escape(c.message)}</td></tr>")
        parts.append("</table>")
        parts.append(_charts(v, base))
        parts.append("<h3>Load levels (client side)</h3>" + _levels_table(v))
        parts.append("<h3>/metrics windows</h3>" + _windows_table(v))
    parts.append("</body></html>\n")
    return "".join(parts)


def write_html(
    path: Path, verdicts: Sequence[Verdict], baselines: dict[str, Verdict] | None = None
) -> None:
    """Write :func:`to_html` atomically."""
    _write(path, to_html(verdicts, baselines))
