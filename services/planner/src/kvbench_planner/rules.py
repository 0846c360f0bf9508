"""The product's refusals and warnings for one workload on its machines (PLAN.md "Refusals")."""

from __future__ import annotations

from collections.abc import Callable

from kvbench_contracts.plan import Workload
from kvbench_contracts.problem import Problem
from kvbench_core.allowlist import refusals
from kvbench_planner.cluster import Machine
from kvbench_stacks.catalog import CATALOG, ORCHESTRATOR_LOCKS, StackSpec
from kvbench_stacks.hardware import (
    KNOWN_MODELS,
    WEIGHT_SHARE,
    find_model,
    gpu_spec,
    min_tensor_parallel,
    simulated_gpus,
)
from kvbench_stacks.query import version_tuple
from kvbench_stacks.recipes.servers import LMCACHE_SERVER_OWN_FLAGS

__all__ = ["workload_issues"]


def workload_issues(w: Workload, machines: list[Machine] | None) -> tuple[list[Problem], list[Problem]]:
    """Errors and warnings; ``machines`` is None when the cluster could not be resolved."""
    errors: list[Problem] = []
    warnings: list[Problem] = []

    def err(code: str, message: str, fix: str, field: str) -> None:
        errors.append(Problem(code=code, message=message, fix=fix, field=field, workload=w.name))

    def warn(code: str, message: str, fix: str, field: str) -> None:
        warnings.append(Problem(code=code, message=message, fix=fix, field=field, workload=w.name))

    stack = CATALOG.get(w.stack)
    if w.orchestrator != "bare_metal":
        err("orchestrator_locked", f"{ORCHESTRATOR_LOCKS[w.orchestrator]}", "Choose bare_metal.", "orchestrator")
    if stack is None:
        err("unknown_stack", f"There is no stack {w.stack!r}", "Choose a stack id from `kvbench catalog`.", "stack")
    else:
        _stack_rules(w, stack, machines, err, warn)
    if w.kv_tier == "nvme" and (w.sizing.disk_tier_gb is None or w.sizing.disk_tier_path is None):
        missing = "sizing.disk_tier_gb" if w.sizing.disk_tier_gb is None else "sizing.disk_tier_path"
        err("missing_sizing_field", f"The NVMe SSD tier needs {missing}", f"Set {missing}.", missing)
    _model_rules(w, machines, err, warn)
    if stack is not None:
        _hybrid_model_rules(w, stack, warn)
        _cache_server_rules(w, stack, err, warn)
    _measurement_rules(w, err, warn)
    if machines is not None:
        _machine_rules(w, stack, machines, err, warn)
    return errors, warnings


def _stack_rules(
    w: Workload,
    stack: StackSpec,
    machines: list[Machine] | None,
    err: Callable[[str, str, str, str], None],
    warn: Callable[[str, str, str, str], None],
) -> None:
    if stack.engine != w.engine.name:
        err(
            "stack_engine_mismatch",
            f"The stack {stack.id} runs on {stack.engine}, not {w.engine.name}",
            f"Choose a {w.engine.name} stack, or set engine.name to {stack.engine}.",
            "stack",
        )
    if stack.strategy != w.strategy:
        err(
            "stack_engine_mismatch",
            f"The stack {stack.id} implements the {stack.strategy} strategy, not {w.strategy}",
            f"Set strategy to {stack.strategy}, or choose a {w.strategy} stack.",
            "strategy",
        )
    version = w.engine.version
    if version and stack.engine == w.engine.name and stack.min_version:
        have, oldest = version_tuple(version), version_tuple(stack.min_version)
        if have and have < oldest:
            err(
                "stack_engine_mismatch",
                f"The stack {stack.id} needs {stack.engine} {stack.min_version} or newer, and the engine is {version}",
                f"Set engine.version to {stack.min_version} or newer.",
                "engine.version",
            )
    simulated = w.cluster.sim is not None or any(m.simulated for m in machines or [])
    if not simulated and not version and not stack.checked_releases() and not w.engine.args.get("image"):
        # an image is tagged with the plan's release, else the newest one checked: with neither, nothing to pin
        err(
            "stack_engine_mismatch",
            f"No {stack.engine} release is conformance-checked for {stack.id}, so kvbench will not pick the one "
            "its machines run",
            f"Set engine.version to the {stack.engine} release to run (its image's tag), or engine.args.image.",
            "engine.version",
        )
    if not simulated and stack.engine_image_lacks and not w.engine.args.get("image"):
        err(
            "stack_engine_mismatch",
            f"The stack {stack.id} cannot run from {stack.engine}'s published image: "
            f"it lacks {stack.engine_image_lacks}",
            f"Set engine.args.image to a {stack.engine} image that has it (built from the release image with it "
            "installed).",
            "engine.args.image",
        )
    if stack.lmcache_server and w.kv_tier == "gpu":
        err(
            "needs_lmcache_server",
            "The stack needs an LMCache server on every node",
            "Choose the CPU RAM or NVMe SSD tier.",
            "kv_tier",
        )
    elif w.kv_tier not in stack.tiers:
        if w.engine.name == "sglang":
            err(
                "tier_not_offered",
                "SGLang offers the GPU tier only, because none of its stacks starts an LMCache server",
                "Choose the GPU tier.",
                "kv_tier",
            )
        else:
            err(
                "tier_not_offered",
                f"The stack {stack.id} does not start an LMCache server, so it offers the GPU "
                f"tier only, not {w.kv_tier}",
                "Choose the GPU tier, or an LMCache stack.",
                "kv_tier",
            )
    for need in stack.needs:
        if need == "prefill":
            if w.sizing.prefill_machines is None and w.sizing.prefill_gpus is None:
                err(
                    "missing_sizing_field",
                    "A split stack needs Prefill machines or Prefill GPUs",
                    "Set sizing.prefill_machines or sizing.prefill_gpus.",
                    "sizing.prefill_machines",
                )
        elif getattr(w.sizing, need) is None:
            err(
                "missing_sizing_field",
                f"The stack {stack.id} needs sizing.{need}",
                f"Set sizing.{need}.",
                f"sizing.{need}",
            )
    if stack.strategy in ("split", "split_offload") and w.measurement.routing == "round_robin":
        err(
            "round_robin_split",
            "Round robin cannot route prefill and decode",
            "In Routing, choose a prefill and decode routing policy.",
            "measurement.routing",
        )
    if (
        version
        and stack.engine == w.engine.name
        and not any(v.split()[-1] == version.lstrip("v") for v in stack.live_runs)
    ):
        checked = ", ".join(stack.validated_on) or "no version"
        warn(
            "stack_not_validated",
            f"{stack.id} has no recorded real run on {w.engine.name} {version} (its recipe is conformance-checked "
            f"on {checked}: the engines' own parsers accept it, nothing was served)",
            "Treat the result as a first measurement and read the report's validity section.",
            "engine.version",
        )


def _model_rules(
    w: Workload,
    machines: list[Machine] | None,
    err: Callable[[str, str, str, str], None],
    warn: Callable[[str, str, str, str], None],
) -> None:
    model = find_model(w.model)
    simulated = w.cluster.sim is not None or any(m.simulated for m in machines or [])
    if model is None and simulated:
        known = ", ".join(sorted(m.name for m in KNOWN_MODELS.values()))
        err(
            "invalid_field",
            f"The simulator has no profile for the model {w.model}",
            f"Choose one of {known}, or add the model to kvbench_stacks/models.yaml.",
            "model",
        )
        return
    if model is None:
        warn(
            "unknown_model",
            f"{w.model} is not in kvbench's model table, so its fit was not checked",
            "Check that the weights fit tensor_parallel_size GPUs.",
            "model",
        )
        return
    gpu_names = {m.gpu_model for m in machines or [] if m.gpu_model}
    for name in sorted(gpu_names):
        gpu = gpu_spec(name)
        if gpu is None:
            continue
        tp = w.engine.tensor_parallel_size
        if model.weights_gb > tp * gpu.mem_gb * WEIGHT_SHARE:
            need = min_tensor_parallel(model, gpu)
            err(
                "model_does_not_fit",
                f"{model.name} needs about {model.weights_gb:.0f} GB for its "
                f"{model.weights_dtype.upper()} weights, and {tp} x {gpu.name} give {tp * gpu.mem_gb:.0f} GB "
                f"({WEIGHT_SHARE:.0%} usable for weights); it needs at least {need} {gpu.name} GPUs per engine",
                "Set the tensor parallel size so the weights fit.",
                "engine.tensor_parallel_size",
            )


def _engine_arg(w: Workload, name: str) -> object | None:
    """An engine argument as the plan gives it, spelled with dashes or underscores."""
    args = w.engine.args
    return args.get(name, args.get(name.replace("-", "_")))


def _hybrid_model_rules(w: Workload, stack: StackSpec, warn: Callable[[str, str, str, str], None]) -> None:
    """The LMCache study's production checks for hybrid Mamba/GDN models (reference/lmcache-study.md, section 5.2)."""
    model = find_model(w.model)
    if model is None or model.attention_block_size is None or stack.engine != "vllm":
        return
    block = _engine_arg(w, "block-size")
    n = int(block) if isinstance(block, int | str) and str(block).isdigit() else model.attention_block_size
    batched = _engine_arg(w, "max-num-batched-tokens")
    if isinstance(batched, int | str) and str(batched).isdigit() and int(batched) <= n:
        warn(
            "batched_tokens_at_block_size",
            f"max-num-batched-tokens {batched} is not above the attention block size N = {n} of {w.model}: prefill "
            "and decode cannot share a step, about 7x slower at low hit rates (the LMCache study, section 5.2)",
            f"Set engine.args max-num-batched-tokens between N and 2N; 2N-1 = {2 * n - 1} is the study's choice.",
            "engine.args",
        )
    if stack.lmcache_server:
        warn(
            "hybrid_model_object_groups",
            f"{w.model} is a hybrid Mamba/GDN model: the official LMCache recipe for hybrid Qwen models needs the "
            "server's --separate-object-groups, which kvbench's LMCache server does not pass (as in the study's "
            "main run, where it made no measurable TTFT difference)",
            "Before production, check the answers (at score level: hybrid models are not bit-exact) and the hit "
            "rate with the option on.",
            "stack",
        )


# LMCache server settings the study used to make overflow visible, with the production default (section 5.3)
EXPERIMENT_SETTINGS: dict[str, tuple[float, float, str]] = {
    # flag: (warn above, production default, what it does)
    "eviction-ratio": (0.5, 0.2, "frees that share of L1 at every eviction round"),
}


def _cache_server_rules(
    w: Workload, stack: StackSpec, err: Callable[[str, str, str, str], None], warn: Callable[[str, str, str, str], None]
) -> None:
    if w.sizing.engines_per_cache_server is not None and not stack.lmcache_server:
        err(
            "no_cache_server",
            f"The stack {stack.id} starts no LMCache server, so sizing.engines_per_cache_server has nothing to share",
            "Remove sizing.engines_per_cache_server, or choose a stack with an LMCache server (kvbench catalog).",
            "sizing.engines_per_cache_server",
        )
    args = {key.replace("_", "-"): value for key, value in w.engine.cache_server_args.items()}
    if args and not stack.lmcache_server:
        err(
            "no_cache_server",
            f"The stack {stack.id} starts no cache server, so engine.cache_server_args would change nothing",
            "Remove engine.cache_server_args, or choose a stack with an LMCache server (kvbench catalog).",
            "engine.cache_server_args",
        )
        return
    for flag in sorted(set(args) & LMCACHE_SERVER_OWN_FLAGS):
        err(
            "cache_server_arg_reserved",
            f"kvbench sets the LMCache server's --{flag} itself (from the plan's sizing, tier and ports)",
            f"Remove {flag} from engine.cache_server_args; size the tiers with sizing and kv_tier.",
            f"engine.cache_server_args.{flag}",
        )
    for flag, (above, default, what) in EXPERIMENT_SETTINGS.items():
        value = args.get(flag)
        if isinstance(value, int | float | str) and _number(value) is not None and (_number(value) or 0) > above:
            warn(
                "experiment_setting",
                f"--{flag} {value} {what}: an experiment setting (the LMCache study used 0.99 to force its cache "
                f"over capacity), not production; LMCache's default is {default:g}",
                f"Leave {flag} out (default {default:g}) unless the run measures overflow on purpose.",
                f"engine.cache_server_args.{flag}",
            )


def _number(value: object) -> float | None:
    try:
        return float(str(value))
    except ValueError:
        return None


def _measurement_rules(
    w: Workload, err: Callable[[str, str, str, str], None], warn: Callable[[str, str, str, str], None]
) -> None:
    m, shape, traffic = w.measurement, w.traffic.shape, w.traffic
    if shape != "agentic_replay":
        if m.load_duration_s is not None:
            err(
                "field_not_for_shape",
                "Load duration applies to the agentic data set replay only; other shapes set their own length",
                "Remove measurement.load_duration_s; set traffic.duration_s to bound each job.",
                "measurement.load_duration_s",
            )
        if traffic.dataset is not None:
            err(
                "field_not_for_shape",
                "Only the agentic data set replay reads a dataset",
                "Remove traffic.dataset.",
                "traffic.dataset",
            )
    elif m.load_duration_s is not None and not 120 <= m.load_duration_s <= 14400:
        err(
            "load_duration_range",
            "Load duration must be between 120 and 14400 s",
            "Set measurement.load_duration_s within 120..14400.",
            "measurement.load_duration_s",
        )
    endless = shape in ("synthetic_sessions", "shared_prompt", "per_user_history")
    if traffic.arrivals.mode == "request_rate" and endless and not traffic.duration_s:
        err(
            "missing_field",
            f"A request rate on the {shape} shape never runs out of sessions, so it needs a length",
            "Set traffic.duration_s.",
            "traffic.duration_s",
        )
    needs = {"trace_replay": ("trace", traffic.trace), "document_reuse": ("documents", traffic.documents)}
    if shape in needs and needs[shape][1] is None:
        key = needs[shape][0]
        err("missing_field", f"The {shape} shape needs traffic.{key}", f"Set traffic.{key}.", f"traffic.{key}")
    if traffic.documents is not None:
        bad = [r for r in traffic.documents.measure_rounds if not 1 <= r <= traffic.documents.rounds]
        if bad:
            err(
                "invalid_field",
                f"measure_rounds {bad} are outside 1..{traffic.documents.rounds}",
                "List only rounds that exist.",
                "traffic.documents.measure_rounds",
            )
    if not 0 <= m.warmup_s <= 3600:
        err(
            "warmup_range",
            "Warm-up must be between 0 and 3600 s",
            "Set measurement.warmup_s within 0..3600.",
            "measurement.warmup_s",
        )
    load = w.effective_load_duration_s()
    warmup = w.effective_warmup_s()
    if load and warmup >= load / 2:
        err(
            "warmup_too_long",
            "Warm-up must be less than half the load duration",
            f"Set measurement.warmup_s below {load / 2:g} s.",
            "measurement.warmup_s",
        )
    if m.repeats < 3:
        warn(
            "preliminary",
            "Fewer than 3 repeats: results are preliminary",
            "Set measurement.repeats to 3 or more for confidence intervals.",
            "measurement.repeats",
        )
    if load and load - warmup < 300:
        warn(
            "short_window",
            f"Only {load - warmup:g} s would be measured (less than 300 s)",
            "Lengthen the load or shorten the warm-up.",
            "measurement.warmup_s",
        )


def _machine_rules(
    w: Workload,
    stack: StackSpec | None,
    machines: list[Machine],
    err: Callable[[str, str, str, str], None],
    warn: Callable[[str, str, str, str], None],
) -> None:
    if not machines:
        err("cluster_empty", "The cluster group has no machine", "Add machines to the cluster group.", "cluster")
        return
    kinds = {(m.vendor, (m.gpu_model or "").upper()) for m in machines}
    if len(kinds) > 1:
        listed = ", ".join(sorted(f"{v or '?'} {g or 'no GPU'}" for v, g in kinds))
        err(
            "mixed_pool",
            f"All machines in a pool use the same GPU model and vendor; this group mixes {listed}",
            "Make a cluster group of machines of one GPU model.",
            "cluster",
        )
    if w.cluster.sim is not None and w.cluster.sim.gpu.upper() not in simulated_gpus():
        err(
            "invalid_field",
            f"The simulator has no profile for {w.cluster.sim.gpu}",
            f"Choose one of {', '.join(simulated_gpus())}.",
            "cluster.sim.gpu",
        )
    for machine in machines:  # what each real machine's operator lets a plan run or write there
        if machine.policy is not None and not machine.simulated:
            for problem in refusals(w.engine.args, w.sizing, machine.policy, w.engine.env):
                err(problem.code, f"{machine.name}: {problem.message}", problem.fix, problem.field)
    vendors = {m.vendor for m in machines if m.vendor}
    min_gpus = min(m.gpus for m in machines)
    min_ram = min(m.ram_gb for m in machines)
    tp = w.engine.tensor_parallel_size
    if tp > min_gpus:
        err(
            "tp_exceeds_gpus",
            f"The tensor parallel size is {tp}, and a machine has {min_gpus} GPUs",
            "Set the tensor parallel size to at most the GPUs of the smallest machine.",
            "engine.tensor_parallel_size",
        )
    gpm = w.sizing.gpus_per_machine
    if gpm is not None and gpm > min_gpus:
        err(
            "tp_exceeds_gpus",
            f"GPUs per machine is {gpm}, and a machine has {min_gpus} GPUs",
            "Set GPUs per machine to at most the GPUs of the smallest machine.",
            "sizing.gpus_per_machine",
        )
    if stack is not None:
        if w.engine.name == "trtllm" and "amd" in vendors:
            err(
                "engine_vendor",
                "TensorRT-LLM runs on NVIDIA only, and this pool has AMD GPUs",
                "Choose a vLLM or SGLang stack.",
                "engine.name",
            )
        elif not vendors <= set(stack.vendors):
            err(
                "engine_vendor",
                f"The stack {stack.id} runs on {', '.join(v.upper() for v in stack.vendors)} only, "
                f"and this pool has {', '.join(sorted(v.upper() for v in vendors))} GPUs",
                "Choose a stack the vendor runs.",
                "stack",
            )
        if stack.one_engine_per_machine and (gpm if gpm is not None else min_gpus) != tp:
            err(
                "one_engine_per_machine",
                "The stack runs one engine per machine, and a machine would run more",
                "Set GPUs per machine to the tensor parallel size.",
                "sizing.gpus_per_machine",
            )
        if stack.strategy == "shared_pool" and len(machines) == 1:
            err(
                "shared_pool_single_machine",
                "A shared KV pool shares KV between machines, and this group has one machine",
                "Add a machine to the cluster group, or choose an offload or split stack.",
                "cluster",
            )
        if stack.strategy in ("split", "split_offload"):
            pm, pg = w.sizing.prefill_machines, w.sizing.prefill_gpus
            total_gpus = sum(gpm if gpm is not None else m.gpus for m in machines)
            if (pm is not None and pm >= len(machines)) or (pg is not None and pg >= total_gpus):
                err(
                    "prefill_leaves_no_decode",
                    "Prefill takes the whole pool, and no machine is left to decode",
                    "Give prefill fewer machines or GPUs than the pool has.",
                    "sizing.prefill_machines" if pm is not None else "sizing.prefill_gpus",
                )
        if stack.rdma:
            device = w.network.rdma_device
            for m in machines:
                ports = [p for p in m.rdma if device is None or p.device == device]
                if not any(p.state.upper() == "ACTIVE" for p in ports):
                    err(
                        "rdma_port_down",
                        "An RDMA port is down on a machine",
                        "Check that the card the pool uses is cabled and active. Cards that are not in use do not "
                        "block the run.",
                        f"cluster.{m.name}.rdma" + (f".{device}" if device else ""),
                    )
    if w.sizing.host_memory_gb is not None and min_ram:
        if w.sizing.host_memory_gb > 0.8 * min_ram:
            err(
                "host_memory_too_large",
                f"The host memory tier ({w.sizing.host_memory_gb:g} GB) is above 80% of "
                f"the smallest machine's RAM ({min_ram:g} GB)",
                "Keep the host memory tier well below the machine's RAM.",
                "sizing.host_memory_gb",
            )
        elif w.sizing.host_memory_gb > 0.5 * min_ram:
            warn(
                "host_memory_high",
                f"The host memory tier ({w.sizing.host_memory_gb:g} GB) is above half of the "
                f"smallest machine's RAM ({min_ram:g} GB)",
                "Leave memory for the OS and the engines.",
                "sizing.host_memory_gb",
            )
