"""The review of a plan's question (``search:``): each refusal names the field and the fix, as for every plan field."""

from __future__ import annotations

from pydantic import ValidationError

from kvbench_contracts.plan import Plan, Workload
from kvbench_contracts.problem import Problem
from kvbench_contracts.search import LOAD_PATHS, OBJECTIVE_FIGURES, SearchRange

__all__ = ["search_issues", "searched_workload"]


def searched_workload(plan: Plan) -> Workload | None:
    """The workload the search varies: the one it names, or the plan's only one (None: neither)."""
    assert plan.search is not None
    if plan.search.workload is not None:
        return next((w for w in plan.workloads if w.name == plan.search.workload), None)
    return plan.workloads[0] if len(plan.workloads) == 1 else None


def search_issues(plan: Plan) -> list[Problem]:
    search = plan.search
    if search is None:
        return []
    problems: list[Problem] = []

    def refuse(code: str, message: str, fix: str, field: str) -> None:
        problems.append(Problem(code=code, message=message, fix=fix, field=f"search.{field}"))

    workload = searched_workload(plan)
    if workload is None:
        names = ", ".join(w.name for w in plan.workloads)
        if search.workload is None:
            refuse("search_workload_missing", f"The plan has {len(plan.workloads)} workloads; the search varies one",
                   f"Set search.workload to one of {names}.", "workload")  # fmt: skip
        else:
            refuse("invalid_field", f"There is no workload {search.workload!r} to vary",
                   f"Set search.workload to one of {names}.", "workload")  # fmt: skip
        return problems
    ranges = [path for path, values in search.vary.items() if isinstance(values, SearchRange)]
    for path, values in search.vary.items():
        field = f"vary.{path}"
        if isinstance(values, SearchRange):
            if path not in LOAD_PATHS:
                refuse("search_range_not_load", f"{path} is not a load: only the load is searched as a range",
                       f"Give {path} a list of values to try, or search the load: "
                       f"{' or '.join(LOAD_PATHS)} as from/to.", field)  # fmt: skip
                continue
            mode, have = LOAD_PATHS[path], workload.traffic.arrivals.mode
            if have != mode:
                other = next((p for p, m in LOAD_PATHS.items() if m == have), None)
                fix = f"Set traffic.arrivals.mode to {mode}" + (f", or search {other}." if other else ".")
                refuse("search_load_mode", f"{path} is the load of arrivals mode {mode}; the workload's is {have}",
                       fix, field)  # fmt: skip
            continue
        if not values:
            refuse("search_empty", f"No values to try for {path}", f"Give {path} at least one value.", field)
            continue
        if len(set(values)) != len(values):
            refuse("search_repeated_value", f"{path} lists a value twice", "List each value once.", field)
            continue
        for value in values:
            try:
                workload.with_values({path: value})
            except KeyError:
                refuse("search_field_unknown", f"{path} is not a field of a workload, so it cannot be varied",
                       "Name a field by its path in the plan, e.g. sizing.host_memory_gb or "
                       "cluster.sim.machines.", field)  # fmt: skip
                break
            except ValidationError as exc:
                first = exc.errors()[0]
                refuse("search_value_invalid", f"{path} cannot be {value:g}: {first['msg']}",
                       f"Give {path} values it takes.", field)  # fmt: skip
                break
    if len(ranges) > 1:
        refuse("search_two_loads", "Two loads are searched as ranges; one load is searched at a time",
               "Keep one range (the load) and give the other field a list of values.", f"vary.{ranges[1]}")  # fmt: skip
    target = search.objective_target
    if target in search.vary:
        if ranges and target in search.value_paths() and search.direction == "minimize":
            refuse("search_objective_with_load", f"minimize {target} beside a load range has no single answer (each "
                   "value has its own highest load)", "Use objective: maximize goodput_rps (the best value and its "
                   "load), or give the load a list of levels.", "objective")  # fmt: skip
    elif target not in OBJECTIVE_FIGURES:
        refuse("search_objective_unknown", f"The objective {search.objective!r} names neither a varied field nor a "
               "figure", f"minimize or maximize one of {', '.join(search.vary)}, or maximize one of "
               f"{', '.join(OBJECTIVE_FIGURES)}.", "objective")  # fmt: skip
    elif search.direction == "minimize":
        refuse("search_objective_unknown", f"minimize {target}: a throughput is maximized",
               f"Use objective: maximize {target}.", "objective")  # fmt: skip
    return problems
