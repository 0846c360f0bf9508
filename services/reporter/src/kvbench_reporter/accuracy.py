"""The accuracy gate (``measurement.accuracy_gate``): does a KV-cache strategy change what the model answers?

Every request kvbench sends is decoded greedily (temperature 0) and, with the gate on, the load generator keeps a
digest of each answer (up to 10,000 a job, by "session/turn": the same keys for the same seed in every workload).
Each workload's answers are compared with the baseline workload's answers to the same requests, repeat by repeat at
each load level: a dense model's must be identical; a hybrid one (Mamba/GDN state) may differ in a stated share
(HYBRID_TOLERANCE, as the acceptance test allows). A workload whose answers differ beyond that is invalid, and the
differing requests are named."""

from __future__ import annotations

from typing import Any

from kvbench_reporter.acceptance import answers_may_differ

__all__ = ["accuracy_gate"]

NAMED = 10  # differing requests named in the verdict


def accuracy_gate(
    workload: dict[str, Any], baseline: dict[str, Any] | None, answers: dict[str, dict[str, str]], model: str | None
) -> dict[str, Any]:
    """The gate's verdict for ``workload`` against ``baseline`` (their report entries, with ``jobs``); ``answers``:
    job id -> "session/turn" -> digest."""
    allowed = answers_may_differ(model)
    hybrid = allowed > 0
    rule = (
        f"a hybrid model: up to {allowed:.0%} of answers may differ"
        if hybrid
        else "identical answers required (a dense model, greedy decoding, the same requests)"
    )
    if baseline is None:
        return {"verdict": "not checked", "passed": None, "compared": 0, "rule": rule,
                "reason": "no baseline workload to compare answers with"}  # fmt: skip
    if workload["name"] == baseline["name"]:
        kept = sum(len(answers.get(str(j["job_id"]), {})) for j in workload["jobs"])
        return {"verdict": "reference", "passed": True, "compared": 0, "kept": kept, "rule": rule,
                "reason": "the baseline: the other workloads' answers are compared with its own"}  # fmt: skip
    theirs = {(j["load_level"], j["repeat"]): answers.get(str(j["job_id"]), {}) for j in baseline["jobs"]}
    compared, differing = 0, []
    for job in workload["jobs"]:
        mine = answers.get(str(job["job_id"]), {})
        reference = theirs.get((job["load_level"], job["repeat"]), {})
        both = sorted(set(mine) & set(reference))
        compared += len(both)
        differing += [f"{job['job_id']}:{key}" for key in both if mine[key] != reference[key]]
    if not compared:
        return {"verdict": "not checked", "passed": None, "compared": 0, "rule": rule,
                "reason": "no request answered in both this workload and the baseline (answers are kept only with "
                "measurement.accuracy_gate on, in both)"}  # fmt: skip
    share = len(differing) / compared
    passed = share <= allowed
    return {
        "verdict": "passed" if passed else "failed",
        "passed": passed,
        "compared": compared,
        "differ": len(differing),
        "differ_share": share,
        "allowed_share": allowed,
        "rule": rule,
        "differing": differing[:NAMED],
        "reason": ""
        if passed
        else f"{len(differing)} of {compared} answers differ from the baseline's to the same requests "
        f"({share:.1%}; allowed {allowed:.0%}): this strategy changes what the model answers (first: "
        f"{', '.join(differing[:NAMED])})",
    }
