"""What the CLI shows a person: the consoles, the report's comparison table, refusals, record figures."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = [
    "TERMINAL",
    "console",
    "err_console",
    "interrupt_on_signals",
    "ms",
    "print_acceptance",
    "print_comparison",
    "print_fabric",
    "print_figures",
    "print_refusal",
]

# logs and CI are not terminals: give tables room instead of rich's 80-column default
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

TERMINAL = ("succeeded", "failed", "cancelled")


def interrupt_on_signals() -> None:
    """Ctrl-C, SIGTERM and a closed terminal all end in the same clean-up, even where the parent started us
    with SIGINT ignored (a background job of a script)."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def ms(stats: dict[str, Any] | None, key: str) -> str:
    value = (stats or {}).get(key)
    return "–" if value is None else f"{value:,.1f}"


_VALIDITY_SHORT = {"valid": "valid", "preliminary": "prelim.", "invalid": "INVALID"}
_HELPED_SHORT = {
    "helped": "helped",
    "hurt": "hurt",
    "no significant difference": "no diff.",
    "not enough repeats to say": "too few reps",
    "no valid result": "no result",
    "baseline": "baseline",
    "no baseline": "–",
}


def _speedup(stat: dict[str, Any] | None) -> str:
    if not stat or stat.get("mean") is None:
        return "–"
    ci = stat.get("ci95")
    return f"{stat['mean']:.2f}x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_flat(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(_flat(v) for v in value) + "]"
    return str(value)


def print_tested(report: dict[str, Any]) -> None:
    """What was tested, before any figure (the report's ``tested``): model, engine and version, tiers, traffic,
    machines."""
    tested = report.get("tested") or []
    if not tested:
        return
    console.print("[bold]What was tested[/bold]")
    for t in tested:
        machines = "; ".join(
            f"{m.get('machines')} simulated x {m.get('gpus_per_machine')} {m.get('gpu')}"
            if m.get("simulated") and "machines" in m
            else f"{m.get('node_id')}: {m.get('gpus')} x {m.get('gpu')}"
            for m in t.get("machines") or []
        )
        sizing = f"; {_flat(t['sizing'])}" if t.get("sizing") else ""
        console.print(
            f"  {escape(str(t['workload']))}: {escape(str(t['model']))} on {escape(str(t['engine']))} "
            f"{escape(str(t['engine_version']))} ({escape(str(t['stack']))}, tier {escape(str(t['kv_tier']))}"
            f"{escape(sizing)}); {escape(_flat(t.get('traffic')))}; arrivals {escape(_flat(t.get('arrivals')))}; "
            f"{escape(machines or 'no machine recorded')}",
            highlight=False,
        )


def print_comparison(report: dict[str, Any]) -> None:
    """Workloads compared, in 80 columns: what was tested, the baseline first, each one's speed-up and verdict, then
    why."""
    print_tested(report)
    for reason in report.get("reasons") or []:  # a run that failed says why before anything else
        console.print(
            f"[red]{escape(str(reason.get('code', 'failed')))}[/red]: {escape(str(reason.get('message', '')))} "
            f"{escape(str(reason.get('fix', '')))}"
        )
    table = Table(
        title=f"kvbench {escape(report['plan_name'])} · {report['status']} · baseline {report.get('baseline') or '–'}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for column in ("workload", "valid?", "TTFT p50", "TTFT p99", "tok/s", "cached", "vs baseline"):
        table.add_column(
            column, justify="left" if column in ("workload", "valid?", "vs baseline") else "right", overflow="fold"
        )
    for w in report["workloads"]:
        ratio = w.get("cache_hit_ratio")
        comparison = w.get("comparison") or {}
        verdict = str(comparison.get("verdict", "–"))
        against = _HELPED_SHORT.get(verdict, verdict)
        if not comparison.get("is_baseline") and comparison.get("speedup"):
            against = f"{(comparison['speedup']['ttft_p50'].get('mean') or 0):.2f}x {against}"
        table.add_row(
            w["name"],
            _VALIDITY_SHORT.get(w["validity"]["verdict"], w["validity"]["verdict"]),
            ms(w["ttft_ms"], "p50"),
            ms(w["ttft_ms"], "p99"),
            f"{w['output_tokens_per_s']:,.0f}",
            f"{ratio:.0%}" if ratio is not None else "–",
            against,
        )
    console.print(table)
    console.print("[dim]TTFT in ms; vs baseline: TTFT p50 speed-up (baseline / workload) and its verdict[/dim]")
    for w in report["workloads"]:
        comparison = w.get("comparison") or {}
        console.print(f"[bold]{escape(w['name'])}[/bold] ({escape(w['stack'])})", highlight=False)
        speedups = comparison.get("speedup") or {}
        if speedups:
            figures = ", ".join(
                f"{label} {_speedup(speedups.get(key))}"
                for key, label in (
                    ("ttft_p50", "TTFT p50"),
                    ("ttft_p99", "p99"),
                    ("output_tokens_per_s", "throughput"),
                    ("goodput_rps", "goodput"),
                )
            )
            console.print(
                f"  {escape(str(comparison.get('verdict')))} against {escape(str(comparison.get('baseline')))}: "
                f"{figures} (95% intervals)",
                highlight=False,
            )
        disk = [j["disk_tier"] for j in w.get("jobs", []) if j.get("disk_tier")]
        if disk:  # the records outlive the run: say what is left on disk
            last = disk[-1]
            reclaimed = "eviction reclaimed space" if any(d["reclaimed"] for d in disk) else "nothing evicted"
            console.print(
                f"  disk tier: {last['records_after']:,.0f} records, {last['bytes_after'] / 1e9:.1f} GB left after "
                f"the last job; {reclaimed}",
                highlight=False,
            )
        gate = w.get("accuracy")
        if gate:  # did it work: the answers against the baseline's
            differ = f", {gate['differ']:,} differ" if gate.get("differ") is not None else ""
            console.print(
                f"  accuracy gate: {escape(str(gate['verdict']))} ({gate.get('compared', 0):,} answers compared"
                f"{differ}; {escape(str(gate['rule']))})",
                highlight=False,
            )
        for reason in w["validity"]["reasons"]:
            console.print(f"  [dim]{escape(reason)}[/dim]", highlight=False)
    print_fabric(report.get("fabric") or {})


def print_acceptance(accepted: dict[str, Any]) -> None:
    """`kvbench accept`: each step with its result and evidence, then the verdict."""
    marks = {"passed": "[green]pass[/green]", "failed": "[red]FAIL[/red]", "not applicable": "[dim]n/a[/dim]",
             "not checked": "[yellow]not checked[/yellow]"}  # fmt: skip
    for step in accepted["steps"]:
        console.print(f"{marks.get(step['status'], step['status'])} {step['step']}. {escape(step['name'])}")
        if step["evidence"]:
            console.print(f"     {escape(step['evidence'])}", highlight=False)
        if step["reason"] and step["status"] != "passed":
            console.print(f"     [dim]{escape(step['reason'])}[/dim]", highlight=False)
    colour = "green" if accepted["passed"] else "red"
    console.print(f"[{colour}]{escape(accepted['verdict'])}[/{colour}]")


# a switch's ports a terminal lists one by one; past that, the busiest, and one line for the rest (a leaf of fifty
# machines printed fifty lines of "0.00 GB" here; the HTML report keeps the full table)
PORTS_LISTED = 8


def print_fabric(fabric: dict[str, Any]) -> None:
    """Switches the run's machines are cabled to: read or not, and what their ports carried."""
    gate = fabric.get("publish_gate") or {}
    for switch in fabric.get("switches", []):
        state = "read" if switch["read"] else f"[red]unread[/red] ({escape(str(switch.get('reason')))})"
        console.print(f"switch {escape(switch['switch'])}: {state}, {switch['reads']} reads around the run")
        _print_ports(switch.get("ports", []))
    if gate and not gate.get("publishable", True):
        console.print(f"[red]not publishable[/red] [{gate['code']}] {escape(gate['message'])}. {escape(gate['fix'])}")


def _port_bytes(port: dict[str, Any]) -> int:
    return int(port["if.in_octets_delta"]) + int(port["if.out_octets_delta"])


def _print_ports(ports: list[dict[str, Any]]) -> None:
    """Unknown ports by cause (unknown is never shown as 0); the known ones in the switch's order when few, else the
    busiest and a summary of the others."""
    unknown: dict[str, list[str]] = {}
    known = []
    for port in ports:
        if port.get("if.in_octets_delta") is None or port.get("if.out_octets_delta") is None:
            why = "its counters reset" if port.get("reset") else "a read lacked its counters"
            unknown.setdefault(why, []).append(str(port["port"]))
        else:
            known.append(port)
    for why, names in unknown.items():
        window = ports[0]["window_s"]
        listed = ", ".join(names[:PORTS_LISTED]) + (
            f" and {len(names) - PORTS_LISTED} more" if len(names) > PORTS_LISTED else ""
        )
        console.print(f"  {escape(listed)}: unknown over {window:.0f} s ({why})", highlight=False)
    shown = known
    if len(known) > PORTS_LISTED:
        shown = sorted(known, key=_port_bytes, reverse=True)[:PORTS_LISTED]  # stable: ties keep the switch's order
    for port in shown:
        console.print(
            f"  {escape(str(port['port']))}: {_port_bytes(port) / 1e9:,.2f} GB over {port['window_s']:.0f} s "
            f"(in {port.get('in_utilization', 0):.2%} / out {port.get('out_utilization', 0):.2%} of line rate)",
            highlight=False,
        )
    shown_ids = {id(p) for p in shown}
    rest = [p for p in known if id(p) not in shown_ids]
    if rest:
        busiest = max(max(p.get("in_utilization") or 0, p.get("out_utilization") or 0) for p in rest)
        console.print(
            f"  {len(rest)} more ports: {sum(map(_port_bytes, rest)) / 1e9:,.2f} GB in all, the busiest at "
            f"{busiest:.2%} of line rate (every port is in the HTML report)",
            highlight=False,
        )


def print_refusal(body: dict[str, Any]) -> None:
    for entry in body.get("errors", []):
        where = ".".join(p for p in (entry.get("workload"), entry.get("field")) if p)
        text = "[{}] {}: {}".format(entry["code"], where, entry["message"])
        err_console.print("[red]refused[/red] " + escape(text))
        if entry.get("fix"):
            err_console.print(f"         fix: {escape(entry['fix'])}")
    for note in body.get("notes", []):
        err_console.print("[cyan]note[/cyan] " + escape(str(note)))
    for entry in body.get("warnings", []):
        where = ".".join(p for p in (entry.get("workload"), entry.get("field")) if p)
        text = "[{}] {}: {}".format(entry["code"], where, entry["message"])
        err_console.print("[yellow]warning[/yellow] " + escape(text))


def print_figures(figures: dict[str, Any]) -> None:
    """The client-side figures of one job as a table (``report analyze`` and ``load``)."""
    table = Table(
        title=f"{figures['requests_measured']} of {figures['requests_total']} requests measured over "
        f"{figures['window_s']:g} s"
    )
    for column in ("figure", "mean", "p50", "p90", "p95", "p99"):
        table.add_column(column)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        table.add_row(key, *[ms(figures[key], k) for k in ("mean", "p50", "p90", "p95", "p99")])
    console.print(table)
    console.print(
        f"output {figures['output_tokens_per_s']:.1f} tok/s · {figures['request_rate']:.2f} req/s · "
        f"goodput {figures['goodput_rps']:.2f} req/s · errors {figures['errors']}"
    )
    connections = figures.get("connections") or {}
    if connections.get("new"):
        connect = connections["connect_ms"]
        console.print(
            f"new connections {connections['new']:,} ({connections['new_share']:.0%} of requests) · connect "
            f"{ms(connect, 'p50')} ms p50, {ms(connect, 'p99')} ms p99 (not in TTFT)"
        )
