"""The catalog and the recipes describe the same stacks, and the catalog's topology facts hold together."""

from __future__ import annotations

import pytest

from kvbench_stacks.catalog import CATALOG, SIMULATED_STACKS
from kvbench_stacks.recipes import RECIPES, ProcessSpec, RenderContext, recipe, render


def test_every_catalog_stack_has_exactly_one_launch_recipe() -> None:
    assert set(CATALOG) == set(RECIPES)


def test_a_second_recipe_for_a_stack_is_refused() -> None:
    with pytest.raises(ValueError, match="two launch recipes"):
        recipe("vllm-prefix-off")(lambda ctx: {})


def test_split_stacks_render_prefill_and_decode_engines_and_the_rest_do_not() -> None:
    machines = [{"name": f"m{i}", "host": f"10.0.0.{i + 1}", "gpus": 2} for i in range(2)]
    for spec in CATALOG.values():
        ctx = RenderContext.model_validate(
            {
                "stack": spec.id,
                "model": "Qwen/Qwen3-8B",
                "machines": machines,
                "sizing": {"prefill_machines": 1, "host_memory_gb": 10, "shared_store_gb": 10,
                           "shared_mount_path": "/mnt/kv", "disk_tier_path": "/nvme/kv"},
            }
        )  # fmt: skip
        processes: list[ProcessSpec] = [p for specs in render(ctx).values() for p in specs]
        roles = {p.role for p in processes}
        assert ({"prefill", "decode"} <= roles) == spec.split, spec.id
        assert ("engine" in roles) != spec.split, spec.id


def test_shared_store_stacks_are_the_shared_pool_strategy() -> None:
    for spec in CATALOG.values():
        assert (spec.shared_store is not None) == (spec.strategy == "shared_pool"), spec.id


def test_simulated_stacks_are_the_catalogs_simulated_ones() -> None:
    assert set(SIMULATED_STACKS) == {s.id for s in CATALOG.values() if s.simulated}
    assert "vllm-pd-lmcache-store" not in SIMULATED_STACKS  # its hand-off through an LMCache store has no sim form


def test_valkey_listens_on_the_pools_address_not_every_address() -> None:
    machines = [{"name": f"m{i}", "host": f"10.0.0.{i + 1}", "gpus": 1} for i in range(2)]
    ctx = RenderContext.model_validate(
        {
            "stack": "vllm-lmcache-valkey",
            "model": "Qwen/Qwen3-8B",
            "machines": machines,
            "sizing": {"shared_store_gb": 8},
        }
    )
    valkey = next(p for p in render(ctx)["m0"] if p.name == "valkey")
    bound = valkey.argv[valkey.argv.index("--bind") + 1 : valkey.argv.index("--port")]
    assert bound == ["10.0.0.1", "127.0.0.1"]


def test_a_simulated_process_is_an_ordinary_process_spec_reading_its_spec_file() -> None:
    from kvbench_contracts.sim import SimRouterSpec  # noqa: PLC0415
    from kvbench_stacks.recipes.sim import simulated_process  # noqa: PLC0415

    spec = SimRouterSpec(port=9100, engines=["http://127.0.0.1:9101"])
    process = simulated_process("router", "route", "router", spec, "/usr/bin/python3", "127.0.0.1", 9100)
    assert process.argv == ["/usr/bin/python3", "-m", "kvbench_sim", "route", "--spec", "{run_dir}/sim-router.json"]
    assert SimRouterSpec.model_validate_json(process.files["sim-router.json"]) == spec
    assert process.health == ("http", 9100, "/health")
    assert process.serves_requests
    assert process.env == {"PYTHONHASHSEED": "0"}
