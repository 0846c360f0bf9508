"""`kvbench sim search`: a plan's question (``search:``) answered in batch mode, in virtual time.

Each candidate is the searched workload with the varied fields set (``Workload.with_values``), run exactly as
`kvbench sim run` runs that plan (same seeds, same jobs), and it meets the SLO when every one of its measured jobs
meets every target. Values of a field are tried smallest first; when the objective minimizes that field, the first
value that meets the SLO ends the search upward (a larger one would only cost more). A load is searched adaptively:
from the range's low end, doubled until a load misses the SLO (bracket), then bisected until the highest load met
and the lowest load missed are within the stated precision. That assumes a candidate meeting the SLO at a load also
meets it at every lower load (latency rises with load), which holds for the simulator's engines.

Several value rows (the combinations of the other fields, or each value beside a load search) run in parallel, one
process per core.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from typing import Any

from kvbench_contracts.plan import Plan, Workload
from kvbench_contracts.search import SLO_FIGURES, Search, SearchRange, SearchSlo
from kvbench_sim.whatif import run_plan

__all__ = ["Evaluated", "evaluate", "search_plan"]

Values = dict[str, float]
SHOWN = ("ttft_p90_ms", "tpot_p90_ms", "goodput_rps", "output_tokens_per_s", "request_rate", "error_rate")


@dataclass
class Evaluated:
    """One candidate: its values, whether every measured job met the SLO, what it missed and by how much, and its
    figures (each SLO figure at its worst over the jobs, and the throughputs)."""

    values: Values
    met: bool
    missed: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, float | None] = field(default_factory=dict)
    jobs: int = 0
    wall_s: float = 0.0
    scout: bool = False  # run on a shortened window to find where to look; never an answer

    def worst_miss(self) -> float:
        """The largest share by which a target was missed (0 when met): how close a failing candidate came."""
        return max((math.inf if m["by_share"] is None else m["by_share"] for m in self.missed), default=0.0)


def job_figure(job: dict[str, Any], name: str) -> float | None:
    """A figure of one job of `kvbench sim run`'s report, by its SLO name."""
    source, percentile, _ = SLO_FIGURES[name]
    if source == "error_rate":
        total = job.get("requests_total") or 0
        return (job.get("errors") or 0) / total if total else None
    value = job.get(source)
    if percentile is not None:
        value = value.get(percentile) if isinstance(value, dict) else None
    return float(value) if value is not None else None


def judge(jobs: list[dict[str, Any]], slo: SearchSlo) -> tuple[bool, list[dict[str, Any]], dict[str, float | None]]:
    """Whether every job meets every target; what was missed (at the worst job); the figures at their worst."""
    figures: dict[str, float | None] = {}
    missed: list[dict[str, Any]] = []
    targets = slo.targets()
    for name in dict.fromkeys([*targets, *SHOWN]):
        direction = SLO_FIGURES[name][2]
        values = [job_figure(job, name) for job in jobs]
        known = [v for v in values if v is not None]
        worst = (max(known) if direction == "max" else min(known)) if known else None
        figures[name] = worst
        if name not in targets:
            continue
        target = targets[name]
        if worst is None or len(known) < len(values):
            missed.append({"figure": name, "target": target, "got": worst, "by_share": None,
                           "why": f"{name}: no measured request in a job"})  # fmt: skip
        elif (direction == "max" and worst > target) or (direction == "min" and worst < target):
            share = abs(worst - target) / target
            missed.append({"figure": name, "target": target, "got": worst, "by_share": share,
                           "why": f"{name} {worst:,.4g} against {'at most' if direction == 'max' else 'at least'} "
                                  f"{target:,.4g} ({share:.0%} off)"})  # fmt: skip
    return not missed, missed, figures


def evaluate(plan: Plan, workload: Workload, values: Values, scout: bool = False) -> Evaluated:
    """The workload with ``values`` set, run as `kvbench sim run` runs it, judged against the plan's SLO."""
    assert plan.search is not None
    started = time.monotonic()
    candidate = Plan.model_validate({"version": 1, "name": plan.name, "workloads": [workload.with_values(values)]})
    report = run_plan(candidate)
    jobs = [job for point in report["workloads"][0]["test_points"] for job in point["jobs"]]
    met, missed, figures = judge(jobs, plan.search.slo)
    return Evaluated(values, met, missed, figures, len(jobs), time.monotonic() - started, scout)


SCOUT_SHARE = 0.2  # a scout measures this share of the job's window (at least SCOUT_MIN_S)
SCOUT_MIN_S = 30.0


def _scout_of(workload: Workload) -> Workload | None:
    """The workload on a shorter window, to find roughly where its highest load lies for a fifth of the cost (an
    overloaded job is the costliest to simulate); None where the job has no set length to shorten."""
    if workload.traffic.duration_s is None or workload.traffic.shape == "agentic_replay":
        return None
    warmup = workload.effective_warmup_s()
    measured = workload.traffic.duration_s - warmup
    if measured * SCOUT_SHARE < SCOUT_MIN_S:
        return None
    return workload.with_values({"traffic.duration_s": warmup + measured * SCOUT_SHARE})


def _closer(low: float, high: float, whole: bool, precision: float) -> bool:
    return (high - low) <= 1 if whole else (high - low) / low <= precision + 1e-9


def _load_search(
    plan: Plan,
    workload: Workload,
    row: Values,
    path: str,
    span: SearchRange,
    hint: float | None = None,
    scout: bool = False,
) -> list[Evaluated]:
    """The highest load of ``path`` meeting the SLO with ``row`` set: bracketed (from the range's low end, doubling;
    or around ``hint``, the answer of a neighbouring row, which is usually a point or two away), then bisected until
    the highest load met and the lowest load missed are within the range's precision. Returns every point
    evaluated, in order."""
    whole = path.endswith("users")
    tried: list[Evaluated] = []
    low_end = float(math.ceil(span.low)) if whole else span.low
    high_end = float(math.floor(span.high)) if whole else span.high

    def at(load: float) -> bool:
        tried.append(evaluate(plan, workload, {**row, path: load}, scout))
        return tried[-1].met

    def step_up(load: float) -> float:
        return min(high_end, max(load + 1, math.ceil(load * (1 + span.precision))) if whole
                   else load * (1 + span.precision))  # fmt: skip

    met_at: float | None = None
    missed_at: float | None = None
    if hint is not None and low_end < hint <= high_end:
        if at(hint):  # met: the next step up most often misses, and the search is over
            met_at = hint
            probe = step_up(hint)
            while met_at < high_end and missed_at is None:
                if at(probe):
                    met_at, probe = probe, min(high_end, probe * 2)
                else:
                    missed_at = probe
        else:  # missed: step down, each step twice the last (one precision first), until a load meets
            missed_at, factor = hint, 1 + span.precision

            def step_down(load: float) -> float:
                lower = min(load - 1, math.floor(load / factor)) if whole else load / factor
                return max(low_end, float(lower))

            probe = step_down(hint)
            while met_at is None:
                if at(probe):
                    met_at = probe
                elif probe <= low_end:
                    return tried  # nothing in the range meets it with these values
                else:
                    factor *= factor
                    missed_at, probe = probe, step_down(probe)
    else:
        if not at(low_end):
            return tried  # nothing in the range meets it with these values
        met_at = low_end
        while met_at < high_end:
            nxt = min(met_at * 2, high_end)
            if at(nxt):
                met_at = nxt
            else:
                missed_at = nxt
                break
    while missed_at is not None and not _closer(met_at, missed_at, whole, span.precision):
        mid = float((met_at + missed_at) // 2) if whole else (met_at + missed_at) / 2
        if at(mid):
            met_at = mid
        else:
            missed_at = mid
    return tried


def _value_row(
    plan: Plan, workload: Workload, row: Values, primary: str | None, values: list[float]
) -> list[Evaluated]:
    """Each value of ``primary`` (smallest first) with ``row`` set, stopping at the first that meets the SLO (the
    objective minimizes it); all of ``row`` alone when there is no primary."""
    if primary is None:
        return [evaluate(plan, workload, row)]
    tried: list[Evaluated] = []
    for value in values:
        tried.append(evaluate(plan, workload, {**row, primary: value}))
        if tried[-1].met:
            break
    return tried


def _rows_job(plan_json: str, rows: list[Values]) -> list[list[dict[str, Any]]]:
    """Consecutive rows of the search, in one worker process (plans travel as JSON; answers as plain dicts): a load
    search starts from the previous row's answer (neighbouring values most often share their highest load)."""
    plan = Plan.model_validate_json(plan_json)
    search, workload = _question(plan)
    load_path = search.load_path()
    answers: list[list[dict[str, Any]]] = []
    hint: float | None = None
    for row in rows:
        if load_path is not None:
            span = search.vary[load_path]
            assert isinstance(span, SearchRange)
            scouted = _scout_of(workload)
            tried = []
            if scouted is not None:  # where to look, on a shorter window; the answer is then confirmed on the full one
                tried = _load_search(plan, scouted, row, load_path, span, hint, scout=True)
                hint = max((t.values[load_path] for t in tried if t.met), default=hint)
            confirmed = _load_search(plan, workload, row, load_path, span, hint)
            tried += confirmed
            hint = max((t.values[load_path] for t in confirmed if t.met), default=hint)
        else:
            primary, values = _primary(search)
            tried = _value_row(plan, workload, row, primary, values)
        answers.append([asdict(t) for t in tried])
    return answers


def _question(plan: Plan) -> tuple[Search, Workload]:
    if plan.search is None:
        raise ValueError("the plan asks no question: add search: (vary, slo, objective)")
    name = plan.search.workload
    if name is None and len(plan.workloads) > 1:
        raise ValueError("search.workload: the plan has several workloads; name the one the search varies")
    workload = next((w for w in plan.workloads if name is None or w.name == name), None)
    if workload is None:
        raise ValueError(f"search.workload: there is no workload {name!r}")
    return plan.search, workload


def _primary(search: Search) -> tuple[str | None, list[float]]:
    """The field scanned smallest first with an early stop (the one the objective minimizes), and its values."""
    target = search.objective_target
    if search.direction == "minimize" and target in search.value_paths() and search.load_path() is None:
        return target, _listed(search, target)
    return None, []


def _rows(search: Search) -> list[Values]:
    """The combinations of the varied value fields the rows hold (the primary field is scanned within a row)."""
    primary, _ = _primary(search)
    paths = [p for p in search.value_paths() if p != primary]
    lists = [_listed(search, p) for p in paths]
    return [dict(zip(paths, combo, strict=True)) for combo in itertools.product(*lists)]


def _listed(search: Search, path: str) -> list[float]:
    values = search.vary[path]
    assert isinstance(values, list)
    return sorted(float(v) for v in values)


def _same_row(e: Evaluated, row: Values) -> bool:
    return all(e.values.get(path) == value for path, value in row.items())


def _dominates(a: Evaluated, b: Evaluated, search: Search) -> bool:
    """``a`` is at least as good as ``b`` on every varied value (less of it) and on the load or objective figure
    (more of it), and better on one."""
    load = search.load_path()
    keys: list[tuple[float, float]] = [(-a.values[p], -b.values[p]) for p in search.value_paths()]
    if load is not None:
        keys.append((a.values[load], b.values[load]))
    elif search.objective_target not in search.vary:
        keys.append((a.figures.get(search.objective_target) or 0.0, b.figures.get(search.objective_target) or 0.0))
    return all(x >= y for x, y in keys) and any(x > y for x, y in keys)


def _best(met: list[Evaluated], search: Search) -> Evaluated | None:
    if not met:
        return None
    target = search.objective_target
    sign = 1.0 if search.direction == "maximize" else -1.0

    def score(e: Evaluated) -> tuple[float, ...]:
        value = e.values.get(target) if target in search.vary else e.figures.get(target)
        # ties: the smaller configuration, then the higher throughput
        return (sign * (value or 0.0), *(-e.values[p] for p in search.value_paths() if p != target),
                e.figures.get("goodput_rps") or 0.0)  # fmt: skip

    return max(met, key=score)


def _why_next_failed(best: Evaluated, evaluated: list[Evaluated], search: Search) -> dict[str, Any] | None:
    """The candidate just past the answer that missed, and what it missed: the next load up (a load search) or the
    next value down of the minimized field."""
    others = dict(best.values)
    load = search.load_path()
    target = search.objective_target

    def same_row(e: Evaluated, free: str) -> bool:
        return all(e.values.get(p) == v for p, v in others.items() if p != free)

    if load is not None:
        above = [e for e in evaluated if same_row(e, load) and e.values[load] > best.values[load] and not e.met]
        nearest = min(above, key=lambda e: e.values[load], default=None)
    elif target in search.vary and search.direction == "minimize":
        below = [e for e in evaluated if same_row(e, target) and e.values[target] < best.values[target] and not e.met]
        nearest = max(below, key=lambda e: e.values[target], default=None)
    else:
        return None
    if nearest is None:
        return None
    return {"values": nearest.values, "missed": nearest.missed}


def search_plan(
    plan: Plan,
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """The answer to the plan's question: ``best`` (each varied field's value by its plan path, and its figures;
    None when no candidate met the SLO, then ``closest`` says what it missed), ``evaluated`` (every candidate, in
    the order tried), ``pareto`` (the candidates no other beats on every varied value and the load) and how long
    it took."""
    search, _ = _question(plan)
    started = time.monotonic()
    rows = _rows(search)
    workers = max(1, min(workers or os.cpu_count() or 1, len(rows)))
    say = progress or (lambda _: None)
    say(f"{len(rows)} row(s) of candidates on {workers} process(es)")
    plan_json = plan.model_dump_json(by_alias=True)
    # each worker takes consecutive rows (a row's load search starts from its neighbour's answer)
    chunks = [list(range(len(rows)))[k::workers] if search.load_path() is None
              else list(range(len(rows)))[k * len(rows) // workers:(k + 1) * len(rows) // workers]
              for k in range(workers)]  # fmt: skip
    results: dict[int, list[dict[str, Any]]] = {}
    if workers == 1:
        for index, tried in enumerate(_rows_job(plan_json, rows)):
            results[index] = tried
        say(f"{len(rows)} row(s) done: {sum(len(r) for r in results.values())} candidate(s)")
    else:
        # spawned, not forked: the caller may run threads (a progress display)
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(_rows_job, plan_json, [rows[i] for i in chunk]): chunk for chunk in chunks}
            for done, future in enumerate(as_completed(futures), start=1):
                for index, tried in zip(futures[future], future.result(), strict=True):
                    results[index] = tried
                say(f"{done} of {len(chunks)} process(es) done: {len(results)} of {len(rows)} row(s)")
    evaluated = [Evaluated(**e) for index in sorted(results) for e in results[index]]
    scouts = [e for e in evaluated if e.scout]
    evaluated = [e for e in evaluated if not e.scout]  # answers come from full-length jobs only
    met = [e for e in evaluated if e.met]
    load = search.load_path()
    if load is not None:  # each row's answer is its highest load met; lower loads of a row are steps, not answers
        rows_met = [[e for e in evaluated if e.met and _same_row(e, row)] for row in rows]
        met = [max(row_met, key=lambda e: e.values[load]) for row_met in rows_met if row_met]
    best = _best(met, search)
    pareto = [e for e in met if not any(_dominates(o, e, search) for o in met if o is not e)]
    answer: dict[str, Any] = {
        "question": search.model_dump(mode="json", by_alias=True, exclude_none=True),
        "workload": search.workload or plan.workloads[0].name,
        "best": None,
        "closest": None,
        "evaluated": [_shown(e) for e in evaluated],
        # shortened jobs that only told the search where to look (a fifth of the window); not answers
        "scouted": [_shown(e) for e in scouts],
        "pareto": [_shown(e) for e in sorted(pareto, key=lambda e: tuple(e.values.values()))],
        "wall_s": time.monotonic() - started,
        "simulated_s": None,
        "precision": _precision(search),
        "assumes": "a candidate meeting the SLO at a load meets it at every lower load",
    }
    if best is not None:
        answer["best"] = {**best.values, "values": best.values, "figures": best.figures,
                          "next_failed": _why_next_failed(best, evaluated, search)}  # fmt: skip
    elif evaluated:
        closest = min(evaluated, key=Evaluated.worst_miss)
        answer["closest"] = {**closest.values, "values": closest.values, "figures": closest.figures,
                             "missed": closest.missed}  # fmt: skip
    return answer


def _shown(e: Evaluated) -> dict[str, Any]:
    return {"values": e.values, "met": e.met, "missed": [m["why"] for m in e.missed], "figures": e.figures,
            "jobs": e.jobs, "wall_s": round(e.wall_s, 3)}  # fmt: skip


def _precision(search: Search) -> str | None:
    load = search.load_path()
    if load is None:
        return None
    span = search.vary[load]
    assert isinstance(span, SearchRange)
    if load.endswith("users"):
        return "the highest number of users meeting the SLO, exactly (the next one up missed it)"
    return f"the highest rate meeting the SLO, within {span.precision:.0%} (the next rate tried above it missed)"
