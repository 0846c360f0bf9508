"""The simulator against the live H200 runs (data/live): the H200 profile in kvbench_stacks/gpus.yaml was fitted on
the cases marked fitted (benchmarks/bench_calibration.py); the rest are held out. Printed: every case, live and
simulated."""

from __future__ import annotations

from pathlib import Path

from kvbench_sim.calibration import live_cases, simulate

LIVE = Path(__file__).resolve().parents[3] / "data" / "live"
# what the simulator leaves out, by the case's own note: an engine's first requests after it started (its warm-up)
OUTSIDE_THE_MODEL = ("first requests",)


def test_the_h200_profile_reproduces_the_live_runs() -> None:
    cases = live_cases(LIVE)
    off = {id(case): simulate(case) / case.measured_ms - 1 for case in cases}
    for case in cases:
        print(f"{case.name:38} {case.figure:13} live {case.measured_ms:7.1f} ms  off {off[id(case)]:+5.0%}"
              f"  {'fitted' if case.fitted else 'held out'} {case.note}")  # fmt: skip
    fitted = [case for case in cases if case.fitted]
    assert len(fitted) >= 8
    assert all(abs(off[id(case)]) <= 0.15 for case in fitted), "the profile no longer matches what it was fitted on"
    held_out = [case for case in cases if not case.fitted]
    assert len(held_out) >= 20
    modelled = [case for case in held_out if not any(word in case.note for word in OUTSIDE_THE_MODEL)]
    # the check: cases the fit never saw within 25%; and all but two of them within its goal, 15% (the
    # two now: a host-memory reload of 2,000-token documents, -21%, and LMCache's L1 reload, -13% to -16%)
    assert all(abs(off[id(case)]) <= 0.25 for case in modelled), [c.name for c in modelled if abs(off[id(c)]) > 0.25]
    assert sum(abs(off[id(case)]) <= 0.15 for case in modelled) >= len(modelled) - 2
