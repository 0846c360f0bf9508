"""The HTML report's charts, built with Plotly (plotly.py's figure objects, drawn by plotly.js inlined once in the
page, so the report stays one self-contained file that works offline).

Why Plotly: its Python package ships the plotly.js bundle (no download at install or render time, no CDN), its
figures validate their own attributes, and plotly.js gives axis titles, round ticks, tooltips, legends that can
hide a series and zoom without code of ours. Vega-Lite was the other candidate; its runtime would have to be
fetched from npm and packaged, where plotly.js comes with a wheel from PyPI.

One colour per workload across every chart; kinds of traffic and prompt-token sources use a second palette so a
colour never means a workload in one chart and something else in the next.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import plotly.graph_objects as go

__all__ = ["Chart", "plotly_bundle", "report_charts"]

WORKLOAD_COLOURS = ("#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d")
# one colour per kind in a stacked chart: at least as many as the longest series (the seven prompt-token sources);
# gpu_hit and recomputed, first and last of those, shared one colour when there were six
KIND_COLOURS = ("#0f766e", "#b45309", "#6d28d9", "#475569", "#a21caf", "#15803d", "#b91c1c", "#0369a1")
SOURCES = ("gpu_hit", "host_tier", "disk", "shared_store", "external_unattributed", "transferred", "recomputed")
SOURCE_LABELS = {
    "gpu_hit": "GPU prefix cache",
    "host_tier": "host memory tier",
    "disk": "disk tier",
    "shared_store": "shared store",
    "external_unattributed": "a KV connector (the engine does not say which tier)",
    "transferred": "transferred from a prefill engine",
    "recomputed": "recomputed",
}


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    figure: go.Figure

    def spec(self) -> str:
        """The figure as plotly.js reads it (data, layout), JSON."""
        return str(self.figure.to_json(validate=False, pretty=False))


@cache
def plotly_bundle() -> str:
    """plotly.js, minified, from the installed plotly package (read once)."""
    from plotly.offline import get_plotlyjs  # noqa: PLC0415

    return str(get_plotlyjs())


def _layout(title: str, x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title, "x": 0.0, "xanchor": "left", "font": {"size": 14}},
        "xaxis": {"title": {"text": x_title}, "automargin": True, "rangemode": "tozero"},
        "yaxis": {"title": {"text": y_title}, "automargin": True, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.25, "x": 0.0},
        "margin": {"l": 60, "r": 20, "t": 40, "b": 60},
        "height": 340,
        "width": 540,
        "template": "plotly_white",
        **extra,
    }


def _colour(index: int) -> str:
    return WORKLOAD_COLOURS[index % len(WORKLOAD_COLOURS)]


def _latency_percentiles(workloads: list[dict[str, Any]], key: str, title: str, unit: str) -> Chart:
    figure = go.Figure(layout=_layout(title, "percentile", f"{title} ({unit})", barmode="group"))
    for i, w in enumerate(workloads):
        stats = w.get(key) or {}
        figure.add_bar(
            name=w["name"],
            x=["p50", "p90", "p99"],
            y=[stats.get(p) for p in ("p50", "p90", "p99")],
            marker_color=_colour(i),
            hovertemplate=f"{w['name']}<br>%{{x}}: %{{y:.1f}} {unit}<extra></extra>",
        )
    return Chart(key, title, figure)


def _throughput(workloads: list[dict[str, Any]]) -> Chart:
    figure = go.Figure(layout=_layout("Output throughput", "workload", "output tokens/s", showlegend=False))
    figure.add_bar(
        x=[w["name"] for w in workloads],
        y=[w.get("output_tokens_per_s") for w in workloads],
        marker_color=[_colour(i) for i in range(len(workloads))],
        hovertemplate="%{x}: %{y:.1f} tokens/s<extra></extra>",
    )
    return Chart("throughput", "Output throughput", figure)


def _cdf(workloads: list[dict[str, Any]], key: str, title: str) -> Chart | None:
    figure = go.Figure(
        layout=_layout(title, f"{title.split(' ', maxsplit=1)[0]} (ms)", "share of requests", yaxis_range=[0, 1])
    )
    drawn = False
    for i, w in enumerate(workloads):
        quantiles = ((w.get("distributions") or {}).get(key)) or []
        if not quantiles:
            continue
        drawn = True
        figure.add_scatter(
            name=w["name"],
            x=quantiles,
            y=[q / (len(quantiles) - 1) for q in range(len(quantiles))],
            mode="lines",
            line={"color": _colour(i), "shape": "hv"},
            hovertemplate=f"{w['name']}<br>%{{y:.0%}} at or below %{{x:.1f}} ms<extra></extra>",
        )
    figure.update_yaxes(tickformat=".0%", rangemode="normal")
    return Chart(f"{key}-cdf", title, figure) if drawn else None


def _ttft_over_time(workloads: list[dict[str, Any]]) -> Chart | None:
    figure = go.Figure(layout=_layout("TTFT over time, per job", "seconds after the job's load start", "TTFT p50 (ms)"))
    warmups: set[float] = set()
    drawn = False
    for i, w in enumerate(workloads):
        for n, job in enumerate(w.get("jobs") or []):
            slices = [s for s in job.get("slices") or [] if s.get("ttft_p50_ms") is not None]
            if not slices:
                continue
            drawn = True
            if job.get("warmup_s"):
                warmups.add(float(job["warmup_s"]))
            figure.add_scatter(
                name=w["name"],
                legendgroup=w["name"],
                showlegend=n == 0,
                x=[s["start_s"] for s in slices],
                y=[s["ttft_p50_ms"] for s in slices],
                mode="lines+markers",
                line={"color": _colour(i)},
                hovertemplate=f"{w['name']} · {job['job_id']}<br>%{{x:.0f}} s: %{{y:.1f}} ms<extra></extra>",
            )
    for warmup in warmups:  # the warm-up is not measured: shaded
        figure.add_vrect(x0=0, x1=warmup, fillcolor="#9ca3af", opacity=0.2, line_width=0,
                         annotation_text="warm-up", annotation_position="top left")  # fmt: skip
    return Chart("ttft-over-time", "TTFT over time, per job", figure) if drawn else None


def _throughput_latency(workloads: list[dict[str, Any]]) -> Chart | None:
    figure = go.Figure(layout=_layout("Throughput against latency", "TTFT p50 (ms)", "output tokens/s"))
    drawn = False
    for i, w in enumerate(workloads):
        points = [tp for tp in w.get("test_points") or [] if (tp.get("ttft_ms") or {}).get("p50") is not None]
        if not points:
            continue
        drawn = True
        figure.add_scatter(
            name=w["name"],
            x=[tp["ttft_ms"]["p50"] for tp in points],
            y=[tp["output_tokens_per_s"] for tp in points],
            text=[f"load {tp['load_level']:g}" for tp in points],
            mode="lines+markers",
            marker={"size": 9, "color": _colour(i)},
            line={"color": _colour(i)},
            hovertemplate=f"{w['name']} · %{{text}}<br>TTFT p50 %{{x:.1f}} ms, %{{y:.1f}} tokens/s<extra></extra>",
        )
    return Chart("throughput-latency", "Throughput against latency", figure) if drawn else None


def _hit_ratio(workloads: list[dict[str, Any]]) -> Chart | None:
    figure = go.Figure(
        layout=_layout("Cache hit ratio over the measured windows", "slice of the window", "prompt tokens cached")
    )
    drawn = False
    for i, w in enumerate(workloads):
        points = [h for h in w.get("hit_ratio_over_time") or [] if h.get("ratio") is not None]
        if not points:
            continue
        drawn = True
        figure.add_scatter(
            name=w["name"],
            x=list(range(1, len(points) + 1)),
            y=[h["ratio"] for h in points],
            mode="lines+markers",
            line={"color": _colour(i)},
            hovertemplate=f"{w['name']}<br>slice %{{x}}: %{{y:.0%}}<extra></extra>",
        )
    figure.update_yaxes(tickformat=".0%", range=[0, 1], rangemode="normal")
    return Chart("hit-ratio", "Cache hit ratio", figure) if drawn else None


def _stacked(
    workloads: list[dict[str, Any]], chart_id: str, title: str, unit: str, series: dict[str, list[float]]
) -> Chart | None:
    if not any(v for values in series.values() for v in values):
        return None
    figure = go.Figure(layout=_layout(title, "workload", f"{title} ({unit})", barmode="stack"))
    for i, (label, values) in enumerate(series.items()):
        if not any(values):
            continue
        figure.add_bar(
            name=label,
            x=[w["name"] for w in workloads],
            y=values,
            marker_color=KIND_COLOURS[i % len(KIND_COLOURS)],
            hovertemplate=f"%{{x}} · {label}: %{{y:,.3g}} {unit}<extra></extra>",
        )
    return Chart(chart_id, title, figure)


def report_charts(workloads: list[dict[str, Any]]) -> list[Chart]:
    """Every chart the report's data can draw; a chart with nothing to show is left out, never drawn empty."""
    moved = {
        label: [float((w.get("kv_bytes_moved") or {}).get(key) or 0.0) / 1e9 for w in workloads]
        for label, key in (
            ("transferred between engines (P/D)", "kv_bytes_transferred"),
            ("loaded from the shared store", "kv_bytes_loaded_remote"),
            ("stored to the shared store", "kv_bytes_stored_remote"),
        )
    }
    sources = {
        SOURCE_LABELS[s]: [float(w["prompt_token_sources"]["tokens"].get(s) or 0.0) for w in workloads] for s in SOURCES
    }
    charts: list[Chart | None] = [
        _latency_percentiles(workloads, "ttft_ms", "Time to first token", "ms"),
        _latency_percentiles(workloads, "tpot_ms", "Time per output token", "ms"),
        _throughput(workloads),
        _cdf(workloads, "ttft_ms", "TTFT distribution"),
        _cdf(workloads, "itl_ms", "ITL distribution"),
        _ttft_over_time(workloads),
        _throughput_latency(workloads),
        _hit_ratio(workloads),
        _stacked(workloads, "kv-moved", "KV bytes moved between machines", "GB", moved),
        _stacked(workloads, "sources", "Where prompt tokens came from", "tokens", sources),
    ]
    return [c for c in charts if c is not None]


def charts_html(charts: list[Chart]) -> str:
    """The charts' containers and the script that draws them (plotly.js inlined before it)."""
    if not charts:
        return ""
    divs = "".join(f'<div class="chart" id="chart-{c.id}" data-title="{c.title}"></div>' for c in charts)
    # each figure is serialised once, by plotly's own encoder, and joined into one object (no parse and re-dump)
    specs = ("{" + ",".join(f"{json.dumps(c.id)}:{c.spec()}" for c in charts) + "}").replace("</", "<\\/")
    return (
        f'<div class="charts">{divs}</div><script>{plotly_bundle()}</script><script>'
        f"const specs = {specs};"
        "for (const [id, spec] of Object.entries(specs)) {"
        "Plotly.newPlot('chart-' + id, spec.data, spec.layout, {displaylogo: false, responsive: false});}"
        "</script>"
    )
