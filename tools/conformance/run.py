"""The conformance suite: every rendered command and config file of every catalog stack fed to the engine's own
parser and config resolution, in the engine's own environment (built by install.py), version by version.

Usage: python tools/conformance/run.py [ENV ...]        (exit 1 on any mismatch or incomplete environment)
A failure the suite expects (known.toml) is reported as known; one that no longer fails is reported too, so the
list cannot go stale. Results: .kvbench/conformance/report.json.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cases import Case, cases, context  # noqa: E402
from install import ENVS_DIR, load_spec, python_of  # noqa: E402

MODEL_DIR = ENVS_DIR / "models"
CHECKS = HERE / "checks"
# the engine-side scripts by check name; each reads a case file and writes a results file
SCRIPTS: dict[str, list[str]] = {
    "vllm": ["vllm_serve.py"],
    "sglang": ["sglang_server.py"],
    "lmcache": ["lmcache_server.py"],
    "vllm-router": ["router.py", "vllm_router"],
    "sglang-router": ["router.py", "sglang_router"],
    "mooncake-master": ["mooncake_master.py"],
}
_MISSING = re.compile(r"No module named '([^']+)'")


@dataclass(frozen=True)
class Outcome:
    env: str
    check: str
    version: str
    case: str
    ok: bool
    error: str
    known: str | None = None  # why the failure is expected


@functools.cache
def _local_model(model: str) -> str:
    """A directory holding only the model's config.json (tools/conformance/models), the engines' model argument."""
    name = model.rsplit("/", 1)[-1]
    source = HERE / "models" / name / "config.json"
    target = MODEL_DIR / name
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(source.read_text())
    return str(target)


def inputs(check: str, all_cases: list[Case]) -> list[dict[str, object]]:
    def argv(c: Case) -> list[str]:
        return [_local_model(c.model) if a == c.model else a for a in c.argv]

    if check == "vllm":
        serve: list[dict[str, object]] = [
            {"id": c.id, "argv": argv(c), "env": {k: v for k, v in c.env.items() if k != "CUDA_VISIBLE_DEVICES"}}
            for c in all_cases
            if c.program == "vllm"
        ]
        # the MooncakeStoreConnector's own config file (MOONCAKE_CONFIG_PATH)
        serve += [
            {"id": f"{c.id}/{name}", "kind": "mooncake_store_config", "text": text}
            for c in all_cases
            if c.program == "vllm" and "MOONCAKE_CONFIG_PATH" in c.env
            for name, text in c.files.items()
        ]
        return serve
    if check == "lmcache":
        # the Mooncake client keys every recorded release reads (recorded/mooncake.toml)
        recorded = tomllib.loads((HERE / "recorded" / "mooncake.toml").read_text())["setup_config"]
        releases = [set(v) for k, v in recorded.items() if isinstance(v, list) and k != "required"]
        mooncake = {"keys": sorted(set.intersection(*releases)), "required": recorded["required"]}
        out: list[dict[str, object]] = [
            {"id": c.id, "kind": "server", "argv": c.argv, "mooncake": mooncake}
            for c in all_cases
            if c.program == "lmcache"
        ]
        out += [
            {"id": f"{c.id}/{name}", "kind": "config", "text": text}
            for c in all_cases
            for name, text in c.files.items()
            if name.startswith("lmcache")
        ]
        return out
    if check == "sglang":
        devices = sorted({str(context(c.stack).network["rdma_device"]) for c in all_cases if c.program == check})
        return [{"id": c.id, "argv": argv(c), "rdma_devices": devices} for c in all_cases if c.program == check]
    return [{"id": c.id, "argv": argv(c)} for c in all_cases if c.program == check]


def load_known() -> list[dict[str, str]]:
    path = HERE / "known.toml"
    return list(tomllib.loads(path.read_text()).get("mismatch", [])) if path.exists() else []


def _covers(k: dict[str, str], check: str, version: str, case: str) -> bool:
    """Whether a known.toml entry is about this check, version and case (globs)."""
    return k["check"] == check and fnmatch.fnmatch(version, k.get("version", "*")) and fnmatch.fnmatch(case, k["case"])


def _known_reason(known: list[dict[str, str]], check: str, version: str, case: str, error: str) -> str | None:
    return next((k["why"] for k in known if _covers(k, check, version, case) and k.get("error", "") in error), None)


def run_env(env: str, checks: dict[str, str], all_cases: list[Case], known: list[dict[str, str]]) -> list[Outcome]:
    outcomes: list[Outcome] = []
    work = ENVS_DIR / "work" / env
    work.mkdir(parents=True, exist_ok=True)
    for check, version in checks.items():
        cases_in = inputs(check, all_cases)
        if not cases_in:
            continue
        cases_path, results_path, log_path = (
            work / f"{check}.json",
            work / f"{check}.results.json",
            work / f"{check}.log",
        )
        cases_path.write_text(json.dumps(cases_in))
        results_path.unlink(missing_ok=True)
        script, *extra = SCRIPTS[check]
        started = time.monotonic()
        with log_path.open("w") as log:
            proc = subprocess.run(
                [str(python_of(env)), str(CHECKS / script), *extra, str(cases_path), str(results_path)],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONHASHSEED": "0"}, check=False,
            )  # fmt: skip
        if proc.returncode != 0 or not results_path.exists():
            tail = log_path.read_text().strip().splitlines()[-3:]
            outcomes += [Outcome(env, check, version, str(c["id"]), False, "checker crashed: " + " | ".join(tail))
                         for c in cases_in]  # fmt: skip
            continue
        for r in json.loads(results_path.read_text()):
            error = str(r.get("error", ""))
            known_why = None if r["ok"] else _known_reason(known, check, version, r["id"], error)
            outcomes.append(Outcome(env, check, version, r["id"], bool(r["ok"]), error, known_why))
        passed = sum(o.ok for o in outcomes if o.env == env and o.check == check)
        print(f"  {env:16} {check:14} {version:8} {passed:3}/{len(cases_in):<3} passed  "
              f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    return outcomes


def metric_outcomes(env: str, checks: dict[str, str]) -> list[Outcome]:
    """Every series the normaliser reads for an engine, against the metrics the installed package defines: absent at
    a version it is claimed for, present where the registry says it is not yet, or of another type, is a mismatch."""
    from kvbench_node_agent.engine_metrics import reads_of

    outcomes: list[Outcome] = []
    for engine in ("vllm", "sglang", "lmcache"):
        version = checks.get(engine)
        if version is None:
            continue
        package = next((ENVS_DIR / env / "lib").glob(f"python3*/site-packages/{engine}"))
        out = ENVS_DIR / "work" / env / f"{engine}.metrics.json"
        prefix = (
            "lmcache" if engine == "lmcache" else f"{engine}:"
        )  # LMCache: lmcache:* and its MP server's lmcache_mp*
        wanted = sorted({w for r in reads_of(engine) for name, values in r.labels for w in (name, *values)})
        subprocess.run([sys.executable, str(CHECKS / "metric_names.py"), str(package), str(out), prefix,
                        ",".join(wanted)], check=True)  # fmt: skip
        found = json.loads(out.read_text())
        held = set(found["held"])
        defined: dict[str, dict[str, object]] = found["defined"]
        names = set(defined) | set(found["mentioned"])
        patterns = [re.compile(p + "$") for p in found["patterns"]]
        for read in reads_of(engine):
            # prometheus_client strips a counter's _total and adds it back: either spelling defines the family
            spellings = {read.family, read.family.removesuffix("_total"), read.total}
            present = bool(spellings & names) or any(p.match(sp) for p in patterns for sp in spellings)
            kind = next((str(defined[sp]["type"]) for sp in spellings if sp in defined), None)
            error = ""
            if read.defined_at(version) and not present:
                error = f"{read.family} ({read.use}) is not defined by {engine} {version}"
            elif not read.defined_at(version) and present:
                error = f"{read.family} is defined by {engine} {version}: its `since` ({read.since}) is wrong"
            elif kind is not None and present and kind != read.kind:
                error = f"{read.family} is a {kind} in {engine} {version}, read as a {read.kind}"
            elif present and (unheld := [w for name, vs in read.labels for w in (name, *vs) if w not in held]):
                # a label or value the normaliser selects by that the engine's source never writes: always absent
                error = f"{read.family}: {engine} {version}'s source holds no {unheld} (labels {dict(read.labels)})"
            outcomes.append(Outcome(env, "metrics", version, f"{engine}/{read.family}", not error, error))
        passed = sum(o.ok for o in outcomes if o.case.startswith(engine))
        label = f"{engine} metrics"
        print(f"  {env:16} {label:14} {version:8} {passed:3}/{len(reads_of(engine)):<3} series read as defined")
    return outcomes


# the packages a program's process runs, by the name of their folder in site-packages: a variable its recipe sets must
# be one of theirs (vLLM loads LMCache's connector in-process)
_ENV_READERS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "lmcache"),
    "sglang": ("sglang",),
    "lmcache": ("lmcache",),
    "vllm-router": ("vllm_router",),
    "sglang-router": ("sglang_router",),
}


def _extra_config_keys(value: object) -> set[str]:
    """Every key of a connector's extra config, nested dicts and lists of dicts included (a MultiConnector's
    connectors, the offloading connector's secondary tiers)."""
    if isinstance(value, dict):
        return {str(k) for k in value} | {k for v in value.values() for k in _extra_config_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _extra_config_keys(v)}
    return set()


def _extra_configs(all_cases: list[Case]) -> dict[str, set[str]]:
    """Every vLLM process's `--kv-transfer-config` extra-config keys, by case."""
    out: dict[str, set[str]] = {}
    for case in all_cases:
        if case.program == "vllm" and "--kv-transfer-config" in case.argv:
            config = json.loads(case.argv[case.argv.index("--kv-transfer-config") + 1])
            out[case.id] = _extra_config_keys(config.get("kv_connector_extra_config") or {})
    return out


_NAMES_READ: dict[str, dict[str, dict[str, set[str]]]] = {}


def _names_read(env: str, checks: dict[str, str], all_cases: list[Case]) -> dict[str, dict[str, set[str]]]:
    """By package folder: the environment variable names its code can read ("env") and which of the rendered
    extra-config keys it holds ("held"), from one pass over each package's source (checks/source_names.py), kept
    for the environment's later checks."""
    if env not in _NAMES_READ:
        site = next((ENVS_DIR / env / "lib").glob("python3*/site-packages"))
        folders = sorted({f for program, readers in _ENV_READERS.items() if program in checks for f in readers})
        # each package's folder and its compiled extensions beside it (vllm_router_rs.abi3.so)
        paths = [p for f in folders for p in [site / f, *site.glob(f"{f}_*.so")] if p.exists()]
        work = ENVS_DIR / "work" / env
        work.mkdir(parents=True, exist_ok=True)
        wanted = sorted({k for keys in _extra_configs(all_cases).values() for k in keys})
        (work / "names.wanted.json").write_text(json.dumps(wanted))
        subprocess.run([sys.executable, str(CHECKS / "source_names.py"), str(work / "names.wanted.json"),
                        str(work / "names.json"), *map(str, paths)], check=True)  # fmt: skip
        read: dict[str, dict[str, set[str]]] = defaultdict(lambda: {"env": set(), "held": set()})
        for path, found in json.loads((work / "names.json").read_text()).items():
            folder = read[path.split("_rs.", 1)[0].split(".", 1)[0]]
            folder["env"] |= set(found["env"])
            folder["held"] |= set(found["held"])
        _NAMES_READ[env] = dict(read)
    return _NAMES_READ[env]


def env_outcomes(env: str, checks: dict[str, str], all_cases: list[Case]) -> list[Outcome]:
    """Every environment variable a process of an engine checked here sets must be one its own packages read (a
    name their source holds) or one recorded/env.toml says who reads; else it does nothing."""
    outside = tomllib.loads((HERE / "recorded" / "env.toml").read_text())["outside"]
    read = _names_read(env, checks, all_cases)
    outcomes: list[Outcome] = []
    for case in all_cases:
        readers = _ENV_READERS.get(case.program, ())
        if case.program not in checks or not case.env:
            continue
        known = {name for folder in readers for name in read.get(folder, {}).get("env", set())}
        unread = sorted(n for n in case.env if n not in known and n not in outside)
        error = (
            f"{', '.join(unread)}: set for {case.program}, read by neither {' nor '.join(readers)} "
            f"{checks[case.program]} (nor recorded in recorded/env.toml): the setting does nothing"
            if unread
            else ""
        )
        outcomes.append(Outcome(env, "env", checks[case.program], case.id, not unread, error))
    if outcomes:
        print(f"  {env:16} {'env names':14} {'':8} {sum(o.ok for o in outcomes):3}/{len(outcomes):<3} processes set "
              "only variables their engine reads")  # fmt: skip
    return outcomes


def extra_config_outcomes(env: str, checks: dict[str, str], all_cases: list[Case]) -> list[Outcome]:
    """Every key of every rendered `--kv-transfer-config`'s kv_connector_extra_config must be one vLLM (or LMCache,
    whose connector it loads) can read: a string its source holds or a parameter it takes. vLLM validates the JSON's
    top level, never the connectors' extra keys, which they read with .get."""
    version = checks.get("vllm")
    if version is None:
        return []
    read = _names_read(env, checks, all_cases)
    held = {k for folder in _ENV_READERS["vllm"] for k in read.get(folder, {}).get("held", set())}
    outcomes = []
    for case_id, keys in sorted(_extra_configs(all_cases).items()):
        unread = sorted(keys - held)
        error = (
            f"kv_connector_extra_config keys {unread}: read by no code of vLLM {version} or its LMCache"
            if unread
            else ""
        )
        outcomes.append(Outcome(env, "extra-config", version, case_id, not unread, error))
    print(f"  {env:16} {'extra config':14} {version:8} {sum(o.ok for o in outcomes):3}/{len(outcomes):<3} "
          "connector configs hold only keys the engine reads")  # fmt: skip
    return outcomes


# what the normaliser must read from SGLang's own exporter, given what checks/sglang_exporter.py put into it
SGLANG_EXPORTED = {
    "prompt_tokens": 8000.0,
    "prompt_tokens_gpu": 3000.0,
    "prompt_tokens_host": 2000.0,
    "prompt_tokens_recomputed": 3000.0,
    "kv_tokens_loaded_host": 2000.0,
    "kv_tokens_stored_host": 4000.0,
    "kv_tokens_evicted": 3000.0,
    "kv_tokens_loaded_remote": 500.0,
    "kv_tokens_stored_remote": 700.0,
}


def exporter_outcomes(env: str, checks: dict[str, str]) -> list[Outcome]:
    """SGLang's own metrics collectors write a /metrics text with known figures (checks/sglang_exporter.py, in the
    engine's environment); kvbench's normaliser must read those figures back from it, each under its own name."""
    version = checks.get("sglang")
    if version is None:
        return []
    from kvbench_node_agent.normalize import normalize
    from kvbench_node_agent.scrape import parse_samples

    out = ENVS_DIR / "work" / env / "sglang.exporter.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    run = subprocess.run([str(python_of(env)), str(CHECKS / "sglang_exporter.py"), _local_model("Qwen/Qwen3-8B"),
                          str(out)], capture_output=True, text=True, check=False)  # fmt: skip
    if run.returncode != 0:
        error = (run.stderr.strip().splitlines() or ["exited " + str(run.returncode)])[-1]
        return [Outcome(env, "exporter", version, "sglang/exporter", False, f"SGLang's collectors: {error}")]
    read = normalize(parse_samples(out.read_text()), kind="sglang")
    wrong = {k: read.get(k) for k, v in SGLANG_EXPORTED.items() if read.get(k) != v}
    error = f"read {wrong} from SGLang {version}'s own exporter, expected {SGLANG_EXPORTED}" if wrong else ""
    print(f"  {env:16} {'sglang exporter':14} {version:8} {len(SGLANG_EXPORTED) - len(wrong):3}/"
          f"{len(SGLANG_EXPORTED):<3} figures read back")  # fmt: skip
    return [Outcome(env, "exporter", version, "sglang/exporter", not wrong, error)]


def catalog_outcomes(spec: dict[str, dict[str, object]], outcomes: list[Outcome]) -> list[Outcome]:
    """The catalog's validated_on must be exactly the engine versions on which every process of the stack passed
    (its engine's and, in the same environment, its LMCache's and router's checks)."""
    from kvbench_stacks.catalog import CATALOG

    out: list[Outcome] = []
    for stack in CATALOG.values():
        passed = set()
        for env, env_spec in spec.items():
            version = dict(env_spec["checks"]).get(stack.engine)  # type: ignore[call-overload]
            # the golden context's cases (stack/...) and every other tier's (stack@nvme/...)
            mine = [o for o in outcomes if o.env == env and o.case.startswith((f"{stack.id}/", f"{stack.id}@"))]
            if version and any(o.check == stack.engine for o in mine) and all(o.ok or o.known for o in mine):
                passed.add(f"{stack.engine} {version}")
        claimed = set(stack.validated_on)
        error = (
            ""
            if claimed == passed
            else f"catalog.yaml says validated_on {sorted(claimed)}, the engines' code accepted {sorted(passed)}"
        )
        out.append(Outcome("catalog", "catalog", "-", stack.id, not error, error))
    return out


def stale_known(known: list[dict[str, str]], outcomes: list[Outcome]) -> list[dict[str, str]]:
    """Known mismatches that matched nothing this run: fixed (or renamed), so known.toml must lose them."""
    stale = []
    for k in known:
        hits = [o for o in outcomes if _covers(k, o.check, o.version, o.case)]
        if hits and all(o.ok for o in hits):
            stale.append(k)
    return stale


def main() -> int:
    spec = load_spec()
    wanted = sys.argv[1:] or list(spec)
    all_cases = cases()
    known = load_known()
    started = time.monotonic()
    print(f"conformance: {len(all_cases)} rendered processes of the catalog's stacks, {len(wanted)} environments")
    for env in wanted:
        if not python_of(env).exists():
            print(f"conformance env {env} is not built: run `make conformance` (or tools/conformance/install.py)")
            return 1

    def one_env(env: str) -> list[Outcome]:
        checks = dict(spec[env]["checks"])  # type: ignore[call-overload]
        return (
            run_env(env, checks, all_cases, known)
            + metric_outcomes(env, checks)
            + exporter_outcomes(env, checks)
            + env_outcomes(env, checks, all_cases)
            + extra_config_outcomes(env, checks, all_cases)
        )

    # each checker is one process that mostly imports an engine (CPU-bound, single-threaded): the environments run
    # side by side, as many at once as there are cores (KVBENCH_CONFORMANCE_JOBS to choose), each one's checks in
    # order; the outcomes are kept in the environments' order whatever finishes first
    jobs = int(os.environ.get("KVBENCH_CONFORMANCE_JOBS", "0")) or max(1, min(len(wanted), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        outcomes = [o for found in pool.map(one_env, wanted) for o in found]
    if set(wanted) == set(spec):  # what validated_on claims can only be checked against every environment
        outcomes += catalog_outcomes(spec, outcomes)
    failures = [o for o in outcomes if not o.ok and o.known is None]
    missing = sorted({m for o in failures for m in _MISSING.findall(o.error)})
    by_error: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for o in failures:
        by_error[(o.check, o.version, o.error.splitlines()[0][:400] if o.error else "")].append(o.case)
    for (check, version, error), ids in sorted(by_error.items()):
        print(f"\nMISMATCH {check} {version}: {error}\n  " + "\n  ".join(sorted(ids)))
    knowns = [o for o in outcomes if not o.ok and o.known is not None]
    if knowns:
        print(f"\n{len(knowns)} known mismatches (known.toml): " + "; ".join(sorted({o.known or "" for o in knowns})))
    stale = stale_known(known, outcomes)
    for k in stale:
        print(f"\nFIXED but still listed in known.toml: {k['check']} {k.get('version', '*')} {k['case']}")
    if missing:
        print(f"\nthe environments lack modules the engines import: {missing}; add their packages to envs.toml")
    report = {"outcomes": [o.__dict__ for o in outcomes], "seconds": round(time.monotonic() - started, 1)}
    (ENVS_DIR / "report.json").write_text(json.dumps(report, indent=1))
    total = len(outcomes)
    print(f"\nconformance: {sum(o.ok for o in outcomes)} of {total} checks passed, {len(knowns)} known, "
          f"{len(failures)} mismatched, in {time.monotonic() - started:.0f} s")  # fmt: skip
    return 1 if failures or stale else 0


if __name__ == "__main__":
    sys.exit(main())
