"""The report as one self-contained HTML page: inline CSS, charts drawn by plotly.js inlined in the page (see
charts.py), no request leaves the file, works offline."""

from __future__ import annotations

from html import escape
from typing import Any

from kvbench_reporter.charts import charts_html, report_charts
from kvbench_reporter.tested import tested_lines

__all__ = ["render_html"]

_VERDICT_COLOUR = {"valid": "#16a34a", "preliminary": "#d97706", "invalid": "#dc2626"}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return escape(str(value))


def _stat_cells(stats: dict[str, Any] | None) -> str:
    stats = stats or {}
    return "".join(f"<td>{_fmt(stats.get(k))}</td>" for k in ("mean", "p50", "p90", "p99"))


def _gb(value: float | None) -> str:
    return "unknown" if value is None else _fmt(value / 1e9, 3)


def _pct(value: float | None) -> str:
    return "unknown" if value is None else _fmt(100 * value, 3)


def _share(value: float | None) -> str:
    return "an unknown share" if value is None else f"{_fmt(100 * value)}%"


def _port_row(p: dict[str, Any]) -> str:
    cells = [
        escape(str(p["port"])) + (" <small>(counters reset)</small>" if p.get("reset") else ""),
        _gb(p.get("if.in_octets_delta")),
        _gb(p.get("if.out_octets_delta")),
        _pct(p.get("in_utilization")),
        _pct(p.get("out_utilization")),
        _fmt(p.get("speed_mbps"), 0),
        f"{p.get('if.in_errors_delta', '–')} / {p.get('if.out_errors_delta', '–')}",
    ]
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _cable_row(cable: dict[str, Any]) -> str:
    checks = " · ".join(
        f'<span title="{escape(str(c["detail"]))}">{escape(c["check"])}: <b>{escape(c["verdict"])}</b></span>'
        for c in cable["checks"]
    )
    congestion = ", ".join(f"{escape(k)} {v:,}" for k, v in (cable.get("congestion") or {}).items()) or "none counted"
    name = f"{escape(str(cable['node']))} {escape(str(cable['nic']))} &rarr; {escape(str(cable['port']))}"
    return f"<tr><td>{name}</td><td>{checks}</td><td>{congestion}</td></tr>"


def _job_fabric_row(job: dict[str, Any]) -> str:
    if "ports" not in job:
        return f"<tr><td>{escape(job['job_id'])}</td><td colspan=6>{escape(str(job.get('note', '')))}</td></tr>"
    ports = job["ports"]
    busiest = max((max(p.get("in_utilization") or 0, p.get("out_utilization") or 0) for p in ports), default=0.0)
    pause = sum((p.get("pause.in_frames_delta") or 0) + (p.get("pause.out_frames_delta") or 0) for p in ports)
    cells = [
        escape(job["job_id"]),
        escape(job["workload"]),
        _gb(job.get("port_bytes")),
        _gb(job.get("engine_kv_bytes")),
        _fmt(100 * busiest, 3),
        str(pause),
        escape(str((job.get("bottleneck") or {}).get("verdict", ""))),
    ]
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _fabric_html(fabric: dict[str, Any]) -> str:
    """The network underneath: switches, whether each was read around the run, and what its ports carried."""
    switches = fabric.get("switches") or []
    gate = fabric.get("publish_gate") or {}
    parts = ['<section id="fabric"><h2>Network</h2>']
    if not gate.get("publishable", True):
        parts.append(
            f'<p class="gate"><b>Not publishable [{escape(str(gate.get("code")))}]</b>: '
            f"{escape(str(gate.get('message')))}. {escape(str(gate.get('fix')))}</p>"
        )
    if not switches:
        parts.append(f"<p>{escape(str(fabric.get('note', 'no switch data')))}</p></section>")
        return "".join(parts)
    for switch in switches:
        state = "read" if switch["read"] else f"unread: {switch.get('reason')}"
        cables = ", ".join(
            f"{escape(str(c['node']))} {escape(str(c['nic']))} &rarr; {escape(str(c['port']))}"
            for c in switch.get("cabled", [])
        )
        parts.append(f"<p><b>{escape(switch['switch'])}</b> · {escape(state)} · {cables}</p>")
        rows = "".join(_port_row(p) for p in switch.get("ports", []))
        if rows:
            parts.append(
                "<table><tr><th>port</th><th>in GB</th><th>out GB</th><th>in % of line</th><th>out % of line</th>"
                f"<th>speed Mb/s</th><th>errors in/out</th></tr>{rows}</table>"
            )
        cable_rows = "".join(_cable_row(c) for c in switch.get("agreement", []) if c.get("checks"))
        if cable_rows:
            parts.append(
                "<table><tr><th>cable</th><th>checks (PASS / WARN / FAIL)</th><th>host congestion signals</th></tr>"
                f"{cable_rows}</table>"
            )
        job_rows = "".join(_job_fabric_row(j) for j in switch.get("jobs", []))
        if job_rows:
            parts.append(
                "<table><tr><th>job</th><th>workload</th><th>cabled ports GB (in + out)</th><th>engines' KV GB</th>"
                f"<th>busiest port % of line</th><th>pause frames</th><th>verdict</th></tr>{job_rows}</table>"
            )
    parts.append(f"<p><small>{escape(str(fabric.get('definition', '')))}</small></p></section>")
    return "".join(parts)


def _interval(stat: dict[str, Any] | None) -> str:
    if not stat or stat.get("mean") is None:
        return "–"
    ci = stat.get("ci95")
    return f"{stat['mean']:.2f}x" + (f" <small>({ci[0]:.2f}–{ci[1]:.2f})</small>" if ci else "")


def _compared_row(w: dict[str, Any]) -> str:
    verdict = w["validity"]["verdict"]
    badge = f'<span class="badge" style="background:{_VERDICT_COLOUR.get(verdict, "#666")}">{verdict}</span>'
    head = f"<td><b>{escape(w['name'])}</b><br><small>{escape(w['stack'])}</small></td><td>{badge}</td>"
    if not w["requests_measured"]:  # no valid result: say why on its own row
        why = w["validity"]["reasons"][0] if w["validity"]["reasons"] else "nothing was measured"
        return f'<tr class="no-result">{head}<td colspan=10>no valid result: {escape(why)}</td></tr>'
    comparison = w.get("comparison") or {}
    if comparison.get("is_baseline"):
        speedup, helped = "1.00x <small>(baseline)</small>", "baseline"
    else:
        speedup = _interval((comparison.get("speedup") or {}).get("ttft_p50"))
        helped = str(comparison.get("verdict", "–"))
    hit = w["cache_hit_ratio"]
    moved = w.get("transferred_ratio")
    moved_note = f"<br><small>{moved * 100:.0f}% transferred</small>" if moved else ""
    return (
        f"<tr>{head}<td>{_fmt(w['requests'])}</td><td>{_fmt(w['requests_measured'])}</td>"
        f"<td>{_fmt(w['ttft_ms'].get('p50'))}</td><td>{_fmt(w['ttft_ms'].get('p90'))}</td>"
        f"<td>{_fmt(w['ttft_ms'].get('p99'))}</td><td>{_fmt(w['tpot_ms'].get('p50'), 2)}</td>"
        f"<td>{_fmt(w['output_tokens_per_s'])}</td><td>{_fmt(hit * 100 if hit is not None else None)}%{moved_note}</td>"
        f'<td>{speedup}</td><td class="helped">{escape(helped)}</td></tr>'
    )


_FIGURE_LABELS = {
    "ttft_p50": "TTFT p50",
    "ttft_p99": "TTFT p99",
    "output_tokens_per_s": "output throughput",
    "goodput_rps": "goodput",
}


def _comparison_html(w: dict[str, Any]) -> str:
    comparison = w.get("comparison") or {}
    if comparison.get("is_baseline"):
        return "<p>This is the run's baseline: every other workload is compared with it.</p>"
    if not comparison.get("baseline"):
        return f"<p>{escape(str(comparison.get('note', 'no baseline to compare with')))}</p>"
    rows = "".join(
        f"<tr><td>{label}</td><td>{_interval(stat)}</td><td>{escape(str(stat.get('verdict')))}</td>"
        f"<td>{stat.get('n', 0)}</td></tr>"
        for key, label in _FIGURE_LABELS.items()
        if (stat := (comparison.get("speedup") or {}).get(key)) is not None
    )
    return (
        f'<p class="verdict">Against <b>{escape(comparison["baseline"])}</b>: <b>{escape(comparison["verdict"])}</b>'
        f" (TTFT p50).</p><table><tr><th>figure</th><th>speed-up (95% interval)</th><th>verdict</th>"
        f"<th>repeats paired</th></tr>{rows}</table>"
    )


def _limits_html(w: dict[str, Any]) -> str:
    limits = w.get("limits") or {}
    parts = []
    if limits.get("break_even_gbps") is not None:
        parts.append(
            f"<p>Break-even bandwidth: <b>{limits['break_even_gbps']:.2f} GB/s</b> "
            f"({_fmt(limits.get('kv_bytes_per_token'), 0)} KV bytes per token x the fastest prefill seen, "
            f"{_fmt(limits.get('prefill_tokens_per_s_best'), 0)} tokens/s): a tier that loads slower than this "
            "loses to recomputing.</p>"
        )
    tiers = "".join(
        f"<tr><td>{escape(t['tier'])}</td><td>{t['load_gbps']:.3f}</td><td>{t['store_gbps']:.3f}</td>"
        f"<td>{_fmt(t.get('prompt_tokens_served'), 0)}</td><td>{escape(t['verdict'])}</td></tr>"
        for t in limits.get("tiers") or []
    )
    parts.append(
        "<table><tr><th>tier</th><th>load GB/s (average)</th><th>store GB/s</th><th>prompt tokens served</th>"
        f"<th>against recomputing</th></tr>{tiers}</table>"
        if tiers
        else "<p>No KV tier behind the GPU loaded anything in the measured windows.</p>"
    )
    power, util = limits.get("gpu_power_w_mean"), limits.get("gpu_utilization_pct_mean")
    parts.append(
        f"<p>GPU power {_fmt(power, 0)} W, utilisation {_fmt(util, 0)}% (means over the measured windows).</p>"
        if power is not None or util is not None
        else "<p>GPU power and utilisation: not reported by these engines' machines.</p>"
    )
    capacity = limits.get("capacity") or {}
    if capacity.get("goodput_rps_per_machine"):
        plan = f"{_fmt(capacity['goodput_rps_per_machine'], 2)} requests/s of goodput per machine"
        if capacity.get("machines_for_target"):
            plan += (
                f"; {capacity['machines_for_target']} machines for the target of "
                f"{_fmt(capacity['target_goodput_rps'], 2)} requests/s"
            )
        parts.append(f"<p>Capacity: {plan}.</p>")
    cost = limits.get("cost") or {}
    parts.append(
        f"<p>Cost: {_fmt(cost['usd_per_million_output_tokens'], 3)} USD per million output tokens at "
        f"{_fmt(cost['usd_per_gpu_hour'], 2)} USD per GPU-hour.</p>"
        if "usd_per_million_output_tokens" in cost
        else f"<p>Cost: {escape(str(cost.get('note', 'unknown')))}.</p>"
    )
    return "".join(parts)


def _accuracy_html(gate: dict[str, Any] | None) -> str:
    """The accuracy gate's verdict under "Did it work?" (plans with measurement.accuracy_gate)."""
    if not gate:
        return ""
    detail = f"{gate.get('compared', 0):,} answers compared with the baseline's"
    if gate.get("differ") is not None:
        detail += f", {gate['differ']:,} differ"
    named = "".join(f"<li><code>{escape(k)}</code></li>" for k in gate.get("differing") or [])
    return (
        f"<p id='accuracy-gate'>Accuracy gate: <b>{escape(str(gate['verdict']))}</b> ({escape(detail)}; "
        f"{escape(str(gate['rule']))}). {escape(str(gate.get('reason') or ''))}</p>"
        + (f"<ul>{named}</ul>" if named else "")
    )


def _tested_html(tested: list[dict[str, Any]]) -> str:
    """What was tested, first: model, engine and version, tiers, traffic, machines, each engine's command line."""
    if not tested:
        return ""
    blocks = []
    for title, rows in tested_lines(tested):
        body = "".join(
            f"<tr><td>{escape(label)}</td><td style='text-align:left'>"
            + (f"<code>{escape(text)}</code>" if label.split()[-1].startswith("engine-") else escape(text))
            + "</td></tr>"
            for label, text in rows
        )
        blocks.append(f"<h3>{escape(title)}</h3><table class='tested'>{body}</table>")
    return '<section id="tested"><h2>What was tested</h2>' + "".join(blocks) + "</section>"


def render_html(report: dict[str, Any]) -> str:
    workloads = report.get("workloads", [])
    rows = [_compared_row(w) for w in workloads]
    measured_anything = any(w["requests_measured"] for w in workloads)
    charts = report_charts(workloads)
    if not measured_anything:
        charts = []  # a run that measured nothing goes straight to what happened underneath
    sections = []
    for w in workloads:
        reasons = "".join(f"<li>{escape(r)}</li>" for r in w["validity"]["reasons"]) or "<li>all checks passed</li>"
        job_rows = "".join(
            f"<tr><td><code>{escape(j['job_id'])}</code></td><td>{_fmt(j['load_level'], 0)}</td>"
            f"<td>{j['repeat']}</td><td>{escape(j['status'])}</td><td>{_fmt(j['requests'])}</td>"
            f"<td>{_fmt(j.get('requests_measured'))}</td>{_stat_cells(j.get('ttft_ms'))}"
            f"<td>{_fmt(j.get('output_tokens_per_s'))}</td><td>{_fmt(j.get('first_request_ttft_ms'))}</td></tr>"
            for j in w["jobs"]
        )
        disk_rows = "".join(
            f"<tr><td><code>{escape(j['job_id'])}</code></td><td>{_fmt(d['records_before'], 0)}</td>"
            f"<td>{_fmt(d['records_after'], 0)}</td><td>{_fmt(d['bytes_before'] / 1e9)}</td>"
            f"<td>{_fmt(d['bytes_after'] / 1e9)}</td><td>{'yes' if d['reclaimed'] else 'no'}</td></tr>"
            for j in w["jobs"]
            if (d := j.get("disk_tier"))
        )
        disk_table = (
            "<h3>The disk tier's records</h3><p>What the local disk tier held when each job started and ended (its "
            "files counted on each machine). Records outlive the run: nothing removes them but the tier's own "
            "eviction, which starts only at its size limit.</p><table><tr><th>job</th><th>records before</th>"
            "<th>records after</th><th>GB before</th><th>GB after</th><th>eviction reclaimed space?</th></tr>"
            f"{disk_rows}</table>"
            if disk_rows
            else ""
        )
        stack_rows = "".join(
            f"<tr><td>{escape(str(st.get('node_id') or ''))}</td><td><code>{escape(str(st.get('deployment_id') or ''))}"
            "</code></td><td>"
            + "<br>".join(f"{escape(k)}: <code>{escape(v)}</code>" for k, v in sorted(st.get("facts", {}).items()))
            + "</td></tr>"
            for st in w.get("stacks", [])
        )
        stack_table = (
            "<h3>The stacks as they started</h3><p>What each machine read as its stack came up: the attention block "
            "size each engine logged (records made under another block size, model or attention backend are never "
            "hits), what the disk tier already held, the command lines.</p><table><tr><th>machine</th>"
            f"<th>deployment</th><th>facts</th></tr>{stack_rows}</table>"
            if stack_rows
            else ""
        )
        accepted = w.get("acceptance")
        acceptance_html = (
            f"<h3>Acceptance test (kvbench accept)</h3><p>Verdict: <b>{escape(accepted['verdict'])}</b></p>"
            "<table><tr><th>step</th><th>check</th><th>result</th><th>evidence</th><th>why</th></tr>"
            + "".join(
                f"<tr><td>{st['step']}</td><td>{escape(st['name'])}</td><td>{escape(st['status'])}</td>"
                f"<td>{escape(st['evidence'])}</td><td>{escape(st['reason'])}</td></tr>"
                for st in accepted["steps"]
            )
            + "</table>"
            if accepted
            else ""
        )
        ec = w.get("engine_counters")
        engine_line = (
            f"<p>Engine counters over the measured windows ({_fmt(ec.get('engines'), 0)} engine(s), "
            f"{_fmt(ec.get('jobs_with_counters'), 0)} job(s)): "
            f"prompt tokens {_fmt(ec.get('prompt_tokens'), 0)}, GPU prefix hits {_fmt(ec.get('prompt_tokens_gpu'), 0)},"
            f" recomputed {_fmt(ec.get('prompt_tokens_recomputed'), 0)}. Per-request usage says "
            f"{_fmt(w['cached_prompt_tokens'])} of {_fmt(w['prompt_tokens'])} prompt tokens were cached.</p>"
            if ec
            else "<p>No engine counter samples for this workload.</p>"
        )
        short = w["prompt_token_sources"].get("short_coverage") or []
        if short:
            engine_line += (
                "<p><b>Counts are low:</b> "
                + "; ".join(
                    f"job {escape(str(g['job_id']))}, engine {escape(str(g['engine_id']))} ({escape(str(g['role']))})"
                    f" sampled over {_fmt(g['counted_s'])} of {_fmt(g['window_s'])} s"
                    for g in short
                )
                + ". What these engines did outside their samples is not in the counters above.</p>"
            )
        cross = w.get("cross_instance_hits")
        if cross:
            engine_line += (
                "<h4>Reused across instances</h4><p>"
                + escape(str(cross["definition"]).capitalize())
                + f": {_fmt(cross['tokens'], 0)} tokens, {_share(cross.get('share_of_prompt_tokens'))} of the prompt "
                "tokens.</p><table><tr><th>computed by</th><th>reused by</th><th>tokens</th></tr>"
                + "".join(
                    f"<tr><td>{escape(p['computed_by'])}</td><td>{escape(p['reused_by'])}</td>"
                    f"<td>{_fmt(p['tokens'], 0)}</td></tr>"
                    for p in cross["pairs"]
                )
                + "</table>"
            )
        by_role = w["prompt_token_sources"].get("by_role") or {}
        if by_role:
            sides = "; ".join(
                f"{escape(role)} engines: "
                + ", ".join(f"{escape(k)} {_fmt(v, 0)}" for k, v in side["tokens"].items() if v)
                for role, side in by_role.items()
            )
            engine_line += (
                f"<p>Split stack: each prompt is counted once, as the decode engines got it. By side: {sides}.</p>"
            )
        sections.append(
            f"<section><h2>{escape(w['name'])} <small>{escape(w['stack'])} · {escape(w['strategy'])}</small></h2>"
            f"<h3>Did it work?</h3><p>Verdict: <b>{escape(w['validity']['verdict'])}</b>; measured window "
            f"{_fmt(w['window_s'])} s; {_fmt(w['requests_measured'])} requests measured, {_fmt(w['errors'])} errors."
            + (
                f" Times are engine seconds: the simulated engines ran {float(w['time_scale']):g}x faster than real"
                " time."
                if (w.get("time_scale") or 1.0) != 1.0
                else ""
            )
            + f"</p><ul>{reasons}</ul>{acceptance_html}{_accuracy_html(w.get('accuracy'))}"
            f"<h3>How fast?</h3><table><tr><th>figure</th><th>mean</th><th>p50</th><th>p90</th><th>p99</th></tr>"
            + "".join(
                f"<tr><td>{label}</td>{_stat_cells(w[key])}</tr>"
                for label, key in (
                    ("TTFT (ms)", "ttft_ms"),
                    ("TPOT (ms)", "tpot_ms"),
                    ("ITL (ms)", "itl_ms"),
                    ("E2E (ms)", "e2e_ms"),
                )
            )
            + f"</table><h3>Did distributed KV help?</h3>{_comparison_html(w)}{engine_line}"
            f"<h3>What limited performance?</h3>{_limits_html(w)}"
            f"<h3>What happened underneath?</h3><table><tr><th>job</th><th>load</th><th>repeat</th><th>status</th>"
            f"<th>requests</th><th>measured</th><th>TTFT mean</th><th>p50</th><th>p90</th><th>p99</th>"
            f"<th>tok/s</th><th title='TTFT of the job&#39;s first request, measured or not: after a stack restart, "
            f"the cold start'>first request TTFT ms</th></tr>{job_rows}</table>{disk_table}{stack_table}</section>"
        )
    events = "".join(
        f"<tr><td>{escape(e['at'][11:23])}</td><td>{escape(e['schema'])}</td><td>{escape(e['node_id'] or '')}</td>"
        f"<td>{escape(e['job_id'] or '')}</td></tr>"
        for e in report.get("events", [])[:400]
    )
    definitions = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in report.get("definitions", {}).items())
    reasons = "".join(
        f"<li><b>{escape(r.get('code', ''))}</b>: {escape(r.get('message', ''))} {escape(r.get('fix', ''))}</li>"
        for r in report.get("reasons", [])
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvbench report {escape(report["run_id"])}</title>
<style>
body{{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#111;padding:0 16px}}
table{{border-collapse:collapse;margin:8px 0 16px}}td,th{{border:1px solid #ddd;padding:4px 8px;text-align:right}}
td:first-child,th:first-child{{text-align:left}}th{{background:#f3f4f6}}h2{{border-bottom:2px solid #e5e7eb}}
.badge{{color:#fff;border-radius:4px;padding:1px 6px}}.charts{{display:flex;flex-wrap:wrap;gap:12px}}
.chart{{width:540px;height:340px;border:1px solid #e5e7eb}}
dt{{font-weight:600}}dd{{margin:0 0 6px 12px;color:#333}}small{{color:#555;font-weight:normal}}
</style></head><body>
<h1>kvbench report: {escape(report["plan_name"])}</h1>
<p>Run <code>{escape(report["run_id"])}</code> · status <b id="run-status">{escape(report["status"])}</b> ·
submitted {escape(report["submitted_at"])} · generated {escape(report["generated_at"])}</p>
{f'<ul class="reasons">{reasons}</ul>' if reasons else ""}
{_tested_html(report.get("tested") or [])}
<h2>Workloads compared</h2>
<p>Baseline: <b>{escape(str(report.get("baseline") or "none (no own_cache workload)"))}</b>. Speed-up: baseline
TTFT p50 / TTFT p50 (higher is better), geometric mean over paired repeats with its 95% interval.</p>
<table id="compared"><tr><th>workload</th><th>verdict</th><th>requests</th><th>measured</th><th>TTFT p50 ms</th>
<th>p90</th><th>p99</th><th>TPOT p50 ms</th><th>output tok/s</th><th>cached prompt</th><th>speed-up (TTFT p50)</th>
<th>did it help?</th></tr>{"".join(rows)}</table>
{charts_html(charts)}
{"".join(sections)}
{_fabric_html(report.get("fabric") or {})}
<h2>Events</h2><table><tr><th>time (UTC)</th><th>event</th><th>node</th><th>job</th></tr>{events}</table>
<h2>Definitions</h2><dl>{definitions}</dl>
</body></html>"""
