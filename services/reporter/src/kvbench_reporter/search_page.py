"""The answer of `kvbench sim search` as a page: the question, the answer, every point evaluated, and a chart of the
points (met and missed) with the Pareto front drawn through the best trade-offs."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from kvbench_reporter.charts import Chart, _layout, charts_html

__all__ = ["search_html"]

MET, MISSED, FRONT = "#16a34a", "#dc2626", "#2563eb"


def _axes(answer: dict[str, Any]) -> tuple[str, str]:
    """x: the load searched, else the first varied field; y: the objective's figure, else goodput."""
    vary = answer["question"]["vary"]
    load = next((path for path, values in vary.items() if isinstance(values, dict)), None)
    x = load or next(iter(vary))
    target = answer["question"]["objective"].split(" ", 1)[1]
    # a figure the objective maximizes; else (a field minimized) the SLO's first figure, with its target drawn
    y = target if target not in vary else next(iter(answer["question"]["slo"]))
    return x, y


def _chart(answer: dict[str, Any]) -> Chart:
    x, y = _axes(answer)
    others = [p for p in answer["question"]["vary"] if p != x]
    figure = go.Figure(layout=_layout("Every candidate evaluated", x, y))
    for met, colour, name in ((True, MET, "meets the SLO"), (False, MISSED, "misses it")):
        points = [e for e in answer["evaluated"] if e["met"] is met]
        figure.add_scatter(
            name=name, mode="markers", marker={"color": colour, "size": 9},
            x=[e["values"][x] for e in points], y=[e["figures"].get(y) for e in points],
            text=[", ".join(f"{p} {e['values'][p]:g}" for p in others) + ("; " if others else "")
                  + ("met" if met else "; ".join(e["missed"])) for e in points],
        )  # fmt: skip
    if y in answer["question"]["slo"]:
        figure.add_hline(y=answer["question"]["slo"][y], line={"color": MISSED, "dash": "dash", "width": 1},
                         annotation_text=f"SLO {y}", annotation_position="top left")  # fmt: skip
    front = sorted(answer["pareto"], key=lambda e: e["values"][x])
    if len(front) > 1:
        figure.add_scatter(name="Pareto front", mode="lines", line={"color": FRONT, "dash": "dot"},
                           x=[e["values"][x] for e in front], y=[e["figures"].get(y) for e in front])  # fmt: skip
    return Chart("search", "Every candidate evaluated", figure)


def _table(answer: dict[str, Any]) -> str:
    paths = list(answer["question"]["vary"])
    figures = list(answer["evaluated"][0]["figures"]) if answer["evaluated"] else []
    head = "".join(f"<th>{html.escape(p)}</th>" for p in [*paths, "meets", *figures, "missed"])
    rows = []
    for e in answer["evaluated"]:
        cells = [f"{e['values'][p]:g}" for p in paths] + ["yes" if e["met"] else "no"]
        cells += ["-" if e["figures"].get(f) is None else f"{e['figures'][f]:,.4g}" for f in figures]
        cells.append("; ".join(e["missed"]) or "-")
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def search_html(answer: dict[str, Any], plan_name: str) -> str:
    question = answer["question"]
    best = answer.get("best")
    slo = ", ".join(f"{name} {'≤' if not name.startswith(('goodput', 'output', 'request')) else '≥'} {value:g}"
                    for name, value in question["slo"].items())  # fmt: skip
    if best is not None:
        values = ", ".join(f"{p} = {v:g}" for p, v in best["values"].items())
        said = f"<p class='answer'><b>Answer:</b> {html.escape(values)}</p>"
        nxt = best.get("next_failed")
        if nxt:
            why = "; ".join(m["why"] for m in nxt["missed"])
            tried = ", ".join(f"{p} = {v:g}" for p, v in nxt["values"].items())
            said += f"<p>The next candidate, {html.escape(tried)}, missed: {html.escape(why)}.</p>"
    else:
        closest = answer.get("closest") or {}
        why = "; ".join(m["why"] for m in closest.get("missed", []))
        tried = ", ".join(f"{p} = {v:g}" for p, v in closest.get("values", {}).items())
        said = (f"<p class='answer'><b>No candidate meets the SLO.</b> The closest, {html.escape(tried)}, missed: "
                f"{html.escape(why)}.</p>")  # fmt: skip
    precision = f"<p>{html.escape(answer['precision'])}</p>" if answer.get("precision") else ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>kvbench sim search · {html.escape(plan_name)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2rem;max-width:70rem}"
        "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}"
        "td:last-child{text-align:left}"
        ".answer{font-size:1.2rem}</style></head><body>"
        f"<h1>{html.escape(plan_name)}: {html.escape(question['objective'])}</h1>"
        f"<p>Workload {html.escape(answer['workload'])}; every measured job must meet {html.escape(slo)}. "
        "Simulated in batch mode (virtual time); "
        f"{len(answer['evaluated'])} candidates evaluated in {answer['wall_s']:.1f} s.</p>"
        f"{said}{precision}{charts_html([_chart(answer)])}<h2>Every candidate</h2>{_table(answer)}"
        f"<p>Assumes {html.escape(answer['assumes'])}.</p></body></html>"
    )
