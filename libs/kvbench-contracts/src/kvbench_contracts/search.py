"""A plan's question (``search:``): which values of some plan fields, and how much load, meet an SLO, and which of
them is best. The simulator answers it in batch mode (`kvbench sim search`); the planner's review checks it.

The figures an SLO may name are listed once here (``SLO_FIGURES``): each is a job's figure and the direction in which
it must stay of its target."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "LOAD_PATHS",
    "OBJECTIVE_FIGURES",
    "SLO_FIGURES",
    "Search",
    "SearchRange",
    "SearchSlo",
]

# the plan paths a range may vary: the load itself (bracketed, then bisected, to the highest value meeting the SLO)
LOAD_PATHS = {"traffic.arrivals.rates": "request_rate", "traffic.arrivals.users": "closed_loop"}

# an SLO's figure -> (the job figure it reads: a summary and its percentile, or a plain figure; "max": the figure may
# not exceed the target, "min": it may not fall below it)
SLO_FIGURES: dict[str, tuple[str, str | None, Literal["max", "min"]]] = {
    f"{metric}_{p}_ms": (f"{metric}_ms", p, "max")
    for metric in ("ttft", "tpot", "itl", "e2e")
    for p in ("p50", "p90", "p95", "p99")
}
SLO_FIGURES |= {
    "error_rate": ("error_rate", None, "max"),
    "goodput_rps": ("goodput_rps", None, "min"),
    "output_tokens_per_s": ("output_tokens_per_s", None, "min"),
    "request_rate": ("request_rate", None, "min"),
}
# what an objective may maximize besides a varied field: the measured throughput figures
OBJECTIVE_FIGURES = ("goodput_rps", "output_tokens_per_s", "request_rate")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)


class SearchRange(_Strict):
    """A load to search: the highest value from ``from`` to ``to`` that meets the SLO, to ``precision``."""

    low: float = Field(alias="from", gt=0, le=100_000, description="The lowest load tried (tried first)")
    high: float = Field(alias="to", gt=0, le=100_000, description="The highest load tried")
    precision: float = Field(
        0.05,
        gt=0,
        le=0.5,
        description="Bisection stops when the gap between the highest load met and the lowest missed is this share "
        "of the former (users: or one user)",
    )

    @model_validator(mode="after")
    def _ordered(self) -> SearchRange:
        if self.high <= self.low:
            raise ValueError(f"an empty range: to ({self.high:g}) must be above from ({self.low:g})")
        return self


class SearchSlo(_Strict):
    """What every measured job of a candidate must meet (latencies at most, throughputs at least)."""

    ttft_p50_ms: float | None = Field(None, gt=0, description="Time to first token, p50, at most (ms)")
    ttft_p90_ms: float | None = Field(None, gt=0, description="Time to first token, p90, at most (ms)")
    ttft_p95_ms: float | None = Field(None, gt=0, description="Time to first token, p95, at most (ms)")
    ttft_p99_ms: float | None = Field(None, gt=0, description="Time to first token, p99, at most (ms)")
    tpot_p50_ms: float | None = Field(None, gt=0, description="Time per output token, p50, at most (ms)")
    tpot_p90_ms: float | None = Field(None, gt=0, description="Time per output token, p90, at most (ms)")
    tpot_p95_ms: float | None = Field(None, gt=0, description="Time per output token, p95, at most (ms)")
    tpot_p99_ms: float | None = Field(None, gt=0, description="Time per output token, p99, at most (ms)")
    itl_p50_ms: float | None = Field(None, gt=0, description="Inter-token latency, p50, at most (ms)")
    itl_p90_ms: float | None = Field(None, gt=0, description="Inter-token latency, p90, at most (ms)")
    itl_p95_ms: float | None = Field(None, gt=0, description="Inter-token latency, p95, at most (ms)")
    itl_p99_ms: float | None = Field(None, gt=0, description="Inter-token latency, p99, at most (ms)")
    e2e_p50_ms: float | None = Field(None, gt=0, description="End-to-end latency, p50, at most (ms)")
    e2e_p90_ms: float | None = Field(None, gt=0, description="End-to-end latency, p90, at most (ms)")
    e2e_p95_ms: float | None = Field(None, gt=0, description="End-to-end latency, p95, at most (ms)")
    e2e_p99_ms: float | None = Field(None, gt=0, description="End-to-end latency, p99, at most (ms)")
    error_rate: float | None = Field(None, ge=0, le=1, description="Share of requests that failed, at most")
    goodput_rps: float | None = Field(None, gt=0, description="Requests a second meeting measurement.slo, at least")
    output_tokens_per_s: float | None = Field(None, gt=0, description="Output tokens a second, at least")
    request_rate: float | None = Field(None, gt=0, description="Requests answered a second, at least")

    @model_validator(mode="after")
    def _some_target(self) -> SearchSlo:
        if not self.targets():
            raise ValueError(f"give at least one target: {', '.join(SLO_FIGURES)}")
        return self

    def targets(self) -> dict[str, float]:
        return {name: value for name in SLO_FIGURES if (value := getattr(self, name)) is not None}


class Search(_Strict):
    """The question a plan asks: ``vary`` some fields of one workload (a list of values to try, smallest first, or
    a load range), keep the candidates meeting ``slo``, and pick by ``objective``."""

    workload: str | None = Field(None, description="The workload varied (default: the plan's only one)")
    vary: dict[str, list[int | float] | SearchRange] = Field(
        min_length=1,
        max_length=4,
        description="Plan paths of the workload (sizing.host_memory_gb) and the values to try; a range "
        "(from, to) for the load: traffic.arrivals.rates or traffic.arrivals.users",
    )
    slo: SearchSlo = Field(description="What every measured job of a candidate must meet")
    objective: str = Field(
        pattern=r"^(minimize|maximize) [a-z_][a-z0-9_.]*$",
        description="minimize or maximize a varied field (minimize sizing.host_memory_gb), or maximize "
        f"{', '.join(OBJECTIVE_FIGURES)}",
    )

    @property
    def direction(self) -> Literal["minimize", "maximize"]:
        return "minimize" if self.objective.startswith("minimize") else "maximize"

    @property
    def objective_target(self) -> str:
        return self.objective.split(" ", 1)[1]

    def load_path(self) -> str | None:
        """The one varied path searched as a range (the load), if any."""
        return next((path for path, values in self.vary.items() if isinstance(values, SearchRange)), None)

    def value_paths(self) -> list[str]:
        """The varied paths given as lists of values, in the plan's order."""
        return [path for path, values in self.vary.items() if not isinstance(values, SearchRange)]
