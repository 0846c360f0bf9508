"""PLAN.md refusals that depend on the machines, model fit, the expanded review, and the examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvbench_contracts.events import MachinePolicy
from kvbench_planner.cluster import Machine, RdmaPort
from kvbench_planner.validation import load_cluster_file, review_plan, review_text

EXAMPLES = sorted(Path("examples").glob("*.yaml"))


def plan(*workloads: dict[str, Any], cluster: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    defaults = {
        "cluster": cluster or {"group": "lab"},
        "traffic": {"shape": "synthetic_sessions", "duration_s": 900},
        "measurement": {"warmup_s": 300},
        **extra,
    }
    return {"version": 1, "name": "t", "defaults": defaults, "workloads": list(workloads)}


def machines(
    n: int = 2, gpu: str = "L40S", vendor: str = "nvidia", gpus: int = 1, ram: float = 256, rdma: str = "ACTIVE"
) -> list[Machine]:
    return [
        Machine(
            name=f"m{i}",
            vendor=vendor,
            gpu_model=gpu,
            gpus=gpus,
            ram_gb=ram,
            rdma=[RdmaPort(device="mlx5_0", state=rdma), RdmaPort(device="mlx5_1", state="DOWN")],
        )
        for i in range(n)
    ]


def by_code(review: Any) -> dict[str, Any]:
    return {e.code: e for e in review.errors}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path: Path) -> None:
    review = review_text(path.read_bytes())
    assert review.valid, review.as_dict()["errors"]
    assert review.expanded is not None
    assert review.expanded["estimated_duration_s"] > 0


def test_guide_example_235b_needs_4_mi300x_or_8_h100() -> None:
    base = {"name": "big", "strategy": "own_cache", "stack": "vllm-prefix-gpu", "model": "Qwen/Qwen3-235B-A22B"}
    for gpu, vendor, too_small, enough in (("MI300X", "amd", 2, 4), ("H100", "nvidia", 4, 8)):
        small = review_plan(
            plan({**base, "engine": {"tensor_parallel_size": too_small}}),
            {"lab": machines(gpu=gpu, vendor=vendor, gpus=8)}.get,
        )
        fit = by_code(small)["model_does_not_fit"]
        assert f"at least {enough} {gpu}" in fit.message
        assert fit.fix.startswith("Set the tensor parallel size so the weights fit.")
        ok = review_plan(
            plan({**base, "engine": {"tensor_parallel_size": enough}}),
            {"lab": machines(gpu=gpu, vendor=vendor, gpus=8)}.get,
        )
        assert "model_does_not_fit" not in by_code(ok)


def test_review_refuses_what_a_real_machines_operator_does_not_allow() -> None:
    """The agents' allow-lists travel in their inventory: a plan choosing an image or a tier directory they refuse
    is refused at review, naming the machine, the field and the setting; a machine that says nothing is left to its
    agent (which refuses the same at stack start)."""
    strict = MachinePolicy(allowed_images=["vllm/vllm-openai:*"], allowed_data_dirs=["/mnt/nvme"])
    lab = [m.model_copy(update={"policy": strict}) for m in machines(2)]
    workload: dict[str, Any] = {"name": "a", "strategy": "spill", "stack": "vllm-lmcache-mp", "kv_tier": "nvme",
                "engine": {"args": {"image": "evil/miner:latest"}},
                "sizing": {"host_memory_gb": 10, "disk_tier_gb": 50, "disk_tier_path": "/srv/kv"}}  # fmt: skip
    review = review_plan(plan(workload), {"lab": lab}.get)
    refused = [e for e in review.errors if e.code == "not_allowed"]
    assert {(e.field, e.message.split(":")[0]) for e in refused} == {
        ("engine.args.image", "m0"), ("engine.args.image", "m1"),
        ("sizing.disk_tier_path", "m0"), ("sizing.disk_tier_path", "m1"),
    }  # fmt: skip
    assert all("KVBENCH_NODE_AGENT_ALLOWED_" in e.fix for e in refused)
    allowed = {**workload, "engine": {"args": {"image": "vllm/vllm-openai:v0.28.0"}},
               "sizing": {**workload["sizing"], "disk_tier_path": "/mnt/nvme/lmcache"}}  # fmt: skip
    assert not [e for e in review_plan(plan(allowed), {"lab": lab}.get).errors if e.code == "not_allowed"]
    silent = review_plan(plan(workload), {"lab": machines(2)}.get)
    assert not [e for e in silent.errors if e.code == "not_allowed"]


def test_inventory_rules() -> None:
    lab = [*machines(2, gpus=2, ram=100), Machine(name="odd", vendor="nvidia", gpu_model="H100", gpus=2, ram_gb=100)]
    review = review_plan(
        plan(
            {
                "name": "a",
                "strategy": "spill",
                "stack": "vllm-native-cpu-offload",
                "sizing": {"host_memory_gb": 90},
                "engine": {"tensor_parallel_size": 4},
            },
        ),
        {"lab": lab}.get,
    )
    codes = by_code(review)
    assert {"mixed_pool", "tp_exceeds_gpus", "host_memory_too_large"} <= set(codes)


def test_rdma_port_down_blocks_only_the_card_in_use() -> None:
    split = {
        "name": "pd",
        "strategy": "split",
        "stack": "vllm-pd-nixl",
        "sizing": {"prefill_machines": 1},
        "measurement": {"routing": "pd_aware"},
    }
    down = review_plan(plan(split), {"lab": machines(rdma="DOWN")}.get)
    entry = by_code(down)["rdma_port_down"]
    assert entry.message == "An RDMA port is down on a machine"
    assert entry.fix.startswith("Check that the card the pool uses is cabled and active.")
    # mlx5_1 is down on every machine, but the pool uses mlx5_0: not blocked
    fine = review_plan(plan({**split, "network": {"rdma_device": "mlx5_0"}}), {"lab": machines()}.get)
    assert "rdma_port_down" not in by_code(fine)
    in_use_down = review_plan(plan({**split, "network": {"rdma_device": "mlx5_1"}}), {"lab": machines()}.get)
    assert "rdma_port_down" in by_code(in_use_down)


def test_prefill_leaves_no_decode_and_vendor_rules() -> None:
    review = review_plan(
        plan(
            {
                "name": "pd",
                "strategy": "split",
                "stack": "vllm-pd-nixl",
                "sizing": {"prefill_machines": 2},
                "measurement": {"routing": "pd_aware"},
            },
            {"name": "trt", "strategy": "own_cache", "stack": "trtllm-reuse", "engine": {"name": "trtllm"}},
            {
                "name": "mori",
                "strategy": "split",
                "stack": "vllm-pd-mori",
                "sizing": {"prefill_machines": 1},
                "measurement": {"routing": "pd_aware"},
            },
        ),
        {"lab": machines(vendor="amd", gpu="MI300X")}.get,
    )
    errors = [(e.workload, e.code) for e in review.errors]
    assert ("pd", "prefill_leaves_no_decode") in errors
    assert ("trt", "engine_vendor") in errors
    assert ("mori", "engine_vendor") not in errors
    nvidia = review_plan(
        plan(
            {
                "name": "mori",
                "strategy": "split",
                "stack": "vllm-pd-mori",
                "sizing": {"prefill_machines": 1},
                "measurement": {"routing": "pd_aware"},
            }
        ),
        {"lab": machines()}.get,
    )
    assert "engine_vendor" in by_code(nvidia)


def test_warnings_unknown_model_host_memory_high_and_version() -> None:
    review = review_plan(
        plan(
            {
                "name": "a",
                "strategy": "spill",
                "stack": "vllm-native-cpu-offload",
                "model": "acme/secret-model",
                "sizing": {"host_memory_gb": 150},
                "engine": {"version": "0.27.0"},
            },
        ),
        {"lab": machines(ram=256)}.get,
    )
    assert review.valid
    assert {w.code for w in review.warnings} >= {"unknown_model", "host_memory_high", "stack_not_validated"}


@pytest.mark.parametrize(("version", "warned"), [("0.25.1", False), ("0.28.0", True)])
def test_validated_means_a_recorded_real_run_and_the_warning_names_what_was_checked(version: str, warned: bool) -> None:
    # vllm-native-cpu-offload ran for real on vLLM 0.25.1 (data/live); on 0.28.0 only the engine's parsers accepted it
    review = review_plan(
        plan(
            {
                "name": "a",
                "strategy": "spill",
                "stack": "vllm-native-cpu-offload",
                "sizing": {"host_memory_gb": 20},
                "engine": {"version": version},
            }
        ),
        {"lab": machines()}.get,
    )
    warning = by_code_warnings(review).get("stack_not_validated")
    assert (warning is not None) is warned
    if warning is not None:
        assert "no recorded real run on vllm 0.28.0" in warning.message
        assert "conformance-checked on vllm 0.25.1, vllm 0.28.0, vllm 0.33.0" in warning.message


def test_too_old_engine_is_a_stack_mismatch() -> None:
    review = review_plan(
        plan(
            {
                "name": "a",
                "strategy": "spill",
                "stack": "vllm-lmcache-mp",
                "kv_tier": "cpu_ram",
                "sizing": {"host_memory_gb": 20},
                "engine": {"version": "0.20.0"},
            }
        ),
        {"lab": machines(n=1)}.get,
    )
    assert "0.25.1 or newer" in by_code(review)["stack_engine_mismatch"].message


def test_unresolved_group_offline_and_cluster_file() -> None:
    review = review_plan(plan({"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu"}))
    assert "unknown_cluster_group" in by_code(review)
    groups, problem = load_cluster_file(
        b"groups:\n  lab:\n    - {name: n1, vendor: nvidia, gpu_model: L40S, gpus: 1,"
        b" ram_gb: 64, rdma: [{device: mlx5_0, state: ACTIVE}]}\n"
    )
    assert problem is None
    resolved = review_plan(plan({"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu"}), groups.get)
    assert resolved.valid
    _, bad = load_cluster_file(b"groups: {lab: [{name: n1, gpus: many}]}")
    assert bad is not None
    assert "gpus" in bad


def test_review_of_real_machines_shows_the_exact_commands_each_will_run() -> None:
    import shlex  # noqa: PLC0415

    from kvbench_stacks.recipes import PoolMachine, RenderContext, render  # noqa: PLC0415

    groups, _ = load_cluster_file(
        b"groups:\n  lab:\n    - {name: n1, vendor: nvidia, gpu_model: L40S, gpus: 1, ram_gb: 64}\n"
        b"    - {name: n2, vendor: nvidia, gpu_model: L40S, gpus: 1, ram_gb: 64}\n"
    )
    review = review_plan(
        plan(
            {"name": "a", "strategy": "shared_pool", "stack": "vllm-mooncake-store", "sizing": {"shared_store_gb": 8}}
        ),
        groups.get,
    )
    assert review.valid, review.as_dict()
    assert review.expanded is not None
    machines = review.expanded["workloads"][0]["machines"]
    head = machines[0]["commands"]
    assert [c["role"] for c in head] == ["master", "engine"]  # the Mooncake master starts first, on the head
    assert head[1]["command"].startswith("vllm serve Qwen/Qwen3-8B ")
    assert "MOONCAKE_CONFIG_PATH" in head[1]["environment"]
    # exactly the recipe the agents render for this pool
    ctx = RenderContext(stack="vllm-mooncake-store", model="Qwen/Qwen3-8B", sizing={"shared_store_gb": 8},
                        machines=[PoolMachine(name=n, host=n, gpus=1) for n in ("n1", "n2")])  # fmt: skip
    assert shlex.split(machines[1]["commands"][0]["command"]) == render(ctx)["n2"][0].argv


def test_expanded_plan_lists_machines_processes_tiers_and_path() -> None:
    review = review_plan(
        plan(
            {
                "name": "pd",
                "strategy": "split_offload",
                "stack": "vllm-pd-nixl-lmcache",
                "kv_tier": "cpu_ram",
                "sizing": {"prefill_machines": 1, "gpus_per_machine": 1, "host_memory_gb": 32},
                "measurement": {"routing": "pd_aware", "repeats": 2},
                "network": {"rdma_device": "mlx5_0"},
            },
        ),
        {"lab": machines(gpus=4)}.get,
    )
    assert review.valid, review.as_dict()
    assert review.expanded is not None
    w = review.expanded["workloads"][0]
    assert [m["name"] for m in w["machines"]] == ["m0", "m1"]
    assert any("router" in p for p in w["machines"][0]["processes"])
    assert any("lmcache server" in p for p in w["machines"][1]["processes"])
    assert any("(prefill" in p for p in w["machines"][0]["processes"])
    assert any("(decode" in p for p in w["machines"][1]["processes"])
    assert {t["tier"] for t in w["tiers"]} >= {"gpu", "cpu_ram"}
    assert "RDMA (mlx5_0)" in w["network_path"]
    assert len(w["jobs"]) == 2


def test_non_agentic_shapes_are_measured_over_the_whole_run_unless_a_warmup_is_set() -> None:
    base = {
        "version": 1,
        "name": "t",
        "workloads": [
            {
                "name": "a",
                "strategy": "own_cache",
                "stack": "vllm-prefix-gpu",
                "cluster": {"sim": {}},
                "traffic": {"shape": "synthetic_sessions", "duration_s": 600},
            }
        ],
    }
    review = review_plan(base)
    assert review.valid  # the default 300 s warm-up is agentic replay's; it does not apply here
    assert review.plan is not None
    assert review.plan.workloads[0].effective_warmup_s() == 0
    explicit = {**base, "defaults": {"measurement": {"warmup_s": 300}}}
    assert "warmup_too_long" in by_code(review_plan(explicit))


def test_no_duration_means_one_session_per_user() -> None:
    review = review_plan(
        {
            "version": 1,
            "name": "t",
            "workloads": [
                {
                    "name": "a",
                    "strategy": "own_cache",
                    "stack": "vllm-prefix-gpu",
                    "cluster": {"sim": {}},
                    "traffic": {"shape": "synthetic_sessions"},
                }
            ],
        }
    )
    assert review.valid
    assert any("one session" in n for n in review.notes)


def test_every_plan_field_is_described() -> None:
    from kvbench_contracts.plan import Plan  # noqa: PLC0415

    schema = Plan.model_json_schema()
    missing = []
    for name, definition in [("Plan", schema), *schema.get("$defs", {}).items()]:
        for field, spec in definition.get("properties", {}).items():
            if not spec.get("description"):
                missing.append(f"{name}.{field}")
    assert missing == []


def test_a_simulated_workload_needs_a_model_the_simulator_knows() -> None:
    sim = {"sim": {"machines": 2, "gpu": "L40S"}}
    unknown = review_plan(
        plan(
            {"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu", "model": "acme/secret-model"},
            cluster=sim,
        )
    )
    assert not unknown.valid
    (problem,) = [e for e in unknown.errors if e.field == "model"]
    assert "simulator has no profile" in problem.message
    assert "Qwen/Qwen3-8B" in problem.fix
    known = review_plan(
        plan({"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu", "model": "Qwen/Qwen3-8B"}, cluster=sim)
    )
    assert known.valid, known.errors


def test_the_fit_check_reads_the_same_weights_as_the_simulator() -> None:
    # Qwen3-32B in BF16 is 65.6 GB: one L40S (48 GB) cannot hold it, two can; the simulator agrees
    one = review_plan(
        plan({"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu", "model": "Qwen/Qwen3-32B"}),
        {"lab": machines()}.get,
    )
    assert "model_does_not_fit" in {e.code for e in one.errors}
    two = review_plan(
        plan(
            {
                "name": "a",
                "strategy": "own_cache",
                "stack": "vllm-prefix-gpu",
                "model": "Qwen/Qwen3-32B",
                "engine": {"tensor_parallel_size": 2},
            }
        ),
        {"lab": machines(gpus=2)}.get,
    )
    assert "model_does_not_fit" not in {e.code for e in two.errors}


def test_the_lmcache_studys_hybrid_model_checks_are_review_warnings() -> None:
    hybrid = {"name": "a", "strategy": "spill", "stack": "vllm-lmcache-mp", "model": "nvidia/Qwen3.6-35B-A3B-NVFP4",
              "kv_tier": "cpu_ram", "sizing": {"host_memory_gb": 20}}  # fmt: skip
    gb10 = {"sim": {"machines": 1, "gpu": "GB10", "host_memory_gb": 121}}
    at_block = review_plan(plan({**hybrid, "engine": {"args": {"max-num-batched-tokens": 2144}}}, cluster=gb10))
    assert at_block.valid, at_block.errors
    slow = by_code_warnings(at_block)["batched_tokens_at_block_size"]
    assert "about 7x slower at low hit rates" in slow.message
    assert "4287" in slow.fix  # 2N-1 for the model's N = 2144
    assert "--separate-object-groups" in by_code_warnings(at_block)["hybrid_model_object_groups"].message
    fixed = review_plan(plan({**hybrid, "engine": {"args": {"max_num_batched_tokens": 4287}}}, cluster=gb10))
    assert "batched_tokens_at_block_size" not in by_code_warnings(fixed)
    # a dense model has no such checks
    dense = review_plan(plan({**hybrid, "model": "Qwen/Qwen3-8B", "engine": {"args": {"max-num-batched-tokens": 16}}},
                             cluster=gb10))  # fmt: skip
    assert not {"batched_tokens_at_block_size", "hybrid_model_object_groups"} & set(by_code_warnings(dense))


def by_code_warnings(review: Any) -> dict[str, Any]:
    return {w.code: w for w in review.warnings}


def test_cache_server_args_reach_lmcache_and_the_studys_eviction_ratio_is_a_warning() -> None:
    base = {"name": "a", "strategy": "spill", "stack": "vllm-lmcache-mp", "model": "Qwen/Qwen3-8B",
            "kv_tier": "cpu_ram", "sizing": {"host_memory_gb": 20}}  # fmt: skip
    sim = {"sim": {"machines": 1, "gpu": "L40S"}}
    study_args = {"eviction-ratio": 0.99, "eviction_trigger_watermark": 0.8}
    study = review_plan(plan({**base, "engine": {"cache_server_args": study_args}}, cluster=sim))
    assert study.valid, study.errors
    ratio = by_code_warnings(study)["experiment_setting"]
    assert "--eviction-ratio 0.99" in ratio.message
    assert "default is 0.2" in ratio.message
    assert ratio.field.endswith("cache_server_args.eviction-ratio")
    default = review_plan(plan({**base, "engine": {"cache_server_args": {"eviction-ratio": 0.2}}}, cluster=sim))
    assert "experiment_setting" not in by_code_warnings(default)
    # what kvbench sets itself is refused, with the field; a stack without a cache server refuses them all
    own = review_plan(plan({**base, "engine": {"cache_server_args": {"l1-size-gb": 80}}}))
    assert {(e.code, e.field.rsplit(".", 1)[-1]) for e in own.errors} >= {("cache_server_arg_reserved", "l1-size-gb")}
    none = review_plan(plan({**base, "stack": "vllm-prefix-gpu", "strategy": "own_cache", "kv_tier": "gpu",
                             "engine": {"cache_server_args": {"eviction-ratio": 0.2}}}))  # fmt: skip
    assert "no_cache_server" in {e.code for e in none.errors}
    # sharing a server needs a stack that starts one (issue 19): refused with the field, accepted on LMCache's
    lonely = review_plan(plan({**base, "stack": "vllm-prefix-gpu", "strategy": "own_cache", "kv_tier": "gpu",
                               "sizing": {"engines_per_cache_server": 2}}))  # fmt: skip
    assert any(
        e.code == "no_cache_server" and e.field.endswith("sizing.engines_per_cache_server") for e in lonely.errors
    )
    shared = review_plan(plan({**base, "sizing": {"host_memory_gb": 20, "engines_per_cache_server": 2}}))
    assert "no_cache_server" not in {e.code for e in shared.errors}


def test_cache_server_args_are_rendered_on_the_lmcache_server_line() -> None:
    from kvbench_contracts.commands import PoolMachine  # noqa: PLC0415
    from kvbench_contracts.plan import EngineSpec, NetworkSpec, Sizing  # noqa: PLC0415
    from kvbench_stacks.recipes import RenderContext, render  # noqa: PLC0415

    ctx = RenderContext.for_pool(
        "vllm-lmcache-mp", "Qwen/Qwen3-8B", EngineSpec(cache_server_args={"eviction-ratio": 0.99}), "cpu_ram",
        Sizing(host_memory_gb=20), NetworkSpec(), [PoolMachine(name="m", host="10.0.0.1", gpus=1)], "round_robin",
    )  # fmt: skip
    server = next(p for procs in render(ctx).values() for p in procs if p.role == "lmcache")
    assert server.argv[-2:] == ["--eviction-ratio", "0.99"]


@pytest.mark.parametrize(
    ("engine", "refused"),
    [
        ({"name": "trtllm"}, True),  # no release checked and none named: no image tag to pin
        ({"name": "trtllm", "version": "1.2.0"}, False),
        ({"name": "trtllm", "args": {"image": "registry.example/trtllm:1.2.0-site"}}, False),
    ],
)
def test_a_real_run_of_an_engine_no_release_of_which_is_checked_names_its_release(
    engine: dict[str, Any], refused: bool
) -> None:
    review = review_plan(
        plan({"name": "a", "strategy": "own_cache", "stack": "trtllm-reuse", "kv_tier": "gpu", "engine": engine}),
        {"lab": machines(n=1)}.get,
    )
    problem = by_code(review).get("stack_engine_mismatch")
    assert (problem is not None) is refused, review
    if problem is not None:
        assert problem.field == "engine.version"
        assert "engine.version" in problem.fix
        assert "engine.args.image" in problem.fix


def test_a_simulated_run_needs_no_engine_release() -> None:
    review = review_plan(
        plan(
            {
                "name": "a",
                "strategy": "own_cache",
                "stack": "trtllm-reuse",
                "kv_tier": "gpu",
                "engine": {"name": "trtllm"},
            },
            cluster={"sim": {"machines": 1, "gpu": "H100"}},
        ),
        None,
    )
    assert review.valid, review.errors


@pytest.mark.parametrize(
    ("engine", "cluster", "refused"),
    [
        ({"name": "trtllm", "version": "1.2.0"}, None, True),  # NVIDIA's release image: no LMCache in it
        ({"name": "trtllm", "args": {"image": "registry.example/trtllm-lmcache:1"}}, None, False),
        ({"name": "trtllm"}, {"sim": {"machines": 2, "gpu": "H100"}}, False),  # the simulator needs no image
    ],
)
def test_a_stack_whose_engines_load_what_their_published_image_lacks_needs_an_image_that_has_it(
    engine: dict[str, Any], cluster: dict[str, Any] | None, refused: bool
) -> None:
    """trtllm-lmcache-valkey's engines import LMCache's TensorRT-LLM adapter; NVIDIA's release image has no LMCache,
    so a real run would stop at the engines' start: refused at review unless the plan names an image."""
    workload = {"name": "a", "strategy": "shared_pool", "stack": "trtllm-lmcache-valkey", "kv_tier": "cpu_ram",
                "engine": engine, "sizing": {"shared_store_gb": 8, "host_memory_gb": 16}}  # fmt: skip
    review = review_plan(plan(workload, cluster=cluster), {"lab": machines(n=2)}.get)
    problems = [e for e in review.errors if e.field == "engine.args.image"]
    assert bool(problems) is refused, review.errors
    if problems:
        assert problems[0].code == "stack_engine_mismatch"
        assert "LMCache" in problems[0].message
        assert "engine.args.image" in problems[0].fix
    elif cluster is not None:
        assert review.valid, review.errors
