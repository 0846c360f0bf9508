"""The simulator's prediction beside a real run (issue 47, item 4): the same plan through `kvbench sim run` on the
calibrated profile of the machine's GPU, then each workload's TTFT and TPOT p50, predicted against measured.

    python tools/live/predicted.py data/live/2026-12-07-product/report.json examples/live/h200-product.yaml \
        --gpu H200 [--json]

The plan's cluster is replaced by one simulated machine of that GPU (``--host-memory-gb`` of RAM); everything else
(the stacks, engine arguments, sizing, traffic) is the plan's own. A figure more than 15% off is flagged, with the
modelled cost that decides it: TTFT of a prompt recomputed is the prefill (the profile's compute efficiency and
serving-path costs), TTFT of a prompt found in a tier is that tier's load rate, TPOT is the decode step (memory
bandwidth efficiency).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

TOLERANCE = 0.15


def simulate(plan_path: Path, gpu: str, host_memory_gb: float) -> dict[str, Any]:
    plan = yaml.safe_load(plan_path.read_text())
    plan.setdefault("defaults", {})["cluster"] = {
        "sim": {"machines": 1, "gpu": gpu, "gpus_per_machine": 1, "host_memory_gb": host_memory_gb}
    }
    for workload in plan.get("workloads", []):
        workload.pop("cluster", None)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as out:
        yaml.safe_dump(plan, out)
    answer = subprocess.run(
        [
            sys.executable,
            "-c",
            'import sys; from kvbench_cli.entry import main; sys.argv[0] = "kvbench"; main()',
            "sim",
            "run",
            out.name,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    Path(out.name).unlink()
    result: dict[str, Any] = json.loads(answer.stdout)
    return result


def _p50(section: Any) -> float | None:
    if isinstance(section, dict) and isinstance(section.get("p50"), int | float):
        return float(section["p50"])
    return None


def _predicted(workload: dict[str, Any]) -> dict[str, float | None]:
    jobs = [job for point in workload.get("test_points", []) for job in point.get("jobs", [])]
    job = jobs[0] if jobs else {}
    sources = job.get("prompt_token_sources") or {}
    from_tiers = float(sum(v for k, v in sources.items() if k not in ("gpu_hit", "recomputed")) or 0)
    return {"ttft_p50_ms": _p50(job.get("ttft_ms")), "tpot_p50_ms": _p50(job.get("tpot_ms")), "from_tiers": from_tiers}


def _cost(figure: str, tiers: float) -> str:
    if figure == "tpot_p50_ms":
        return "the decode step (the profile's memory-bandwidth efficiency and per-step overhead)"
    if tiers:
        return "the tier's load path (its modelled read rate and the connector's per-request cost)"
    return "prefill (the profile's compute efficiency and the serving path's per-request and per-token costs)"


def compare(report: dict[str, Any], simulated: dict[str, Any]) -> list[dict[str, Any]]:
    predicted = {w["name"]: _predicted(w) for w in simulated.get("workloads", [])}
    rows = []
    for workload in report.get("workloads", []):
        name = workload["name"]
        guess = predicted.get(name, {})
        for figure, section in (("ttft_p50_ms", workload.get("ttft_ms")), ("tpot_p50_ms", workload.get("tpot_ms"))):
            measured, model = _p50(section), guess.get(figure)
            error = (model - measured) / measured if measured and model is not None else None
            rows.append({"workload": name, "figure": figure, "measured": measured, "predicted": model,
                         "error": error, "off": error is not None and abs(error) > TOLERANCE,
                         "cost": _cost(figure, guess.get("from_tiers") or 0.0)})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path)
    parser.add_argument("plan", type=Path)
    parser.add_argument("--gpu", default="H200")
    parser.add_argument("--host-memory-gb", type=float, default=128.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = compare(json.loads(args.report.read_text()), simulate(args.plan, args.gpu, args.host_memory_gb))
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return

    def ms(value: float | None) -> str:
        return f"{value:,.1f}" if value is not None else "-"

    lines = [f"{'workload':<14} {'figure':<12} {'measured':>10} {'predicted':>10} {'error':>8}"]
    for row in rows:
        error = f"{row['error']:+.0%}" if row["error"] is not None else "-"
        flag = f"  more than 15% off: {row['cost']}" if row["off"] else ""
        lines.append(f"{row['workload']:<14} {row['figure']:<12} {ms(row['measured']):>10} "
                     f"{ms(row['predicted']):>10} {error:>8}{flag}")  # fmt: skip
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
