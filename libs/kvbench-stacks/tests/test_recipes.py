"""Golden tests of every stack's rendered recipe on a 2-machine pool, plus what each must contain.

Regenerate the golden files after an intended change with: KVBENCH_UPDATE_GOLDEN=1 make test-unit
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from kvbench_stacks.catalog import CATALOG, get_stack
from kvbench_stacks.query import version_tuple
from kvbench_stacks.recipes import RECIPES, EngineSettings, PoolMachine, RenderContext, render
from kvbench_stacks.recipes.images import LMCACHE_RELEASE, VALKEY_IMAGE, VLLM_ROUTER_RELEASE, newest_checked

GOLDEN = Path(__file__).parent / "golden"

SIZING = {
    "host_memory_gb": 64,
    "shared_store_gb": 100,
    "shared_mount_path": "/mnt/kv",
    "disk_tier_gb": 500,
    "disk_tier_path": "/nvme/kv",
    "prefill_machines": 1,
}


def context(stack: str, gpus: int = 2, vendor: str = "nvidia") -> RenderContext:
    engine = "sglang" if stack.startswith("sglang") else "trtllm" if stack.startswith("trtllm") else "vllm"
    sizing = dict(SIZING)
    if stack == "vllm-pd-nixl-lmcache":
        sizing["gpus_per_machine"] = 1
    tier = "cpu_ram" if "lmcache" in stack else "gpu"
    return RenderContext(
        stack=stack,
        model="Qwen/Qwen3-8B",
        engine=EngineSettings(name=engine, version="1.0.0"),
        kv_tier=tier,
        sizing=sizing,
        network={"rdma_device": "mlx5_0"},
        routing="pd_aware",
        machines=[
            PoolMachine(name="gpu-a", host="10.0.0.1", gpus=gpus, vendor=vendor),
            PoolMachine(name="gpu-b", host="10.0.0.2", gpus=gpus, vendor=vendor),
        ],
    )


def as_text(stack: str) -> str:
    lines = []
    for machine, procs in render(context(stack, vendor="amd" if "mori" in stack else "nvidia")).items():
        for p in procs:
            lines.append(f"[{machine}] {p.name} ({p.role}) ports={json.dumps(p.ports, sort_keys=True)}")
            lines.append("  " + " ".join(p.argv))
            for key, value in sorted(p.env.items()):
                lines.append(f"  env {key}={value}")
            for name, content in sorted(p.files.items()):
                lines.append(f"  file {name}:")
                lines.extend("    " + line for line in content.strip().splitlines())
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("stack", sorted(RECIPES))
def test_rendered_recipe_matches_golden(stack: str) -> None:
    path = GOLDEN / f"{stack}.txt"
    text = as_text(stack)
    if os.environ.get("KVBENCH_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file for {stack}; regenerate with KVBENCH_UPDATE_GOLDEN=1"
    assert text == path.read_text()


@pytest.mark.parametrize("stack", sorted(RECIPES))
def test_no_port_clash_on_a_machine(stack: str) -> None:
    for machine, procs in render(context(stack)).items():
        ports = [port for p in procs for port in p.ports.values()]
        assert len(ports) == len(set(ports)), (machine, [(p.name, p.ports) for p in procs])
        assert any(p.serves_requests for machines in render(context(stack)).values() for p in machines)


EXPECTED = {
    "vllm-prefix-off": ["--no-enable-prefix-caching"],
    "vllm-prefix-gpu": ["--enable-prefix-caching", "--enable-prompt-tokens-details"],
    "vllm-native-cpu-offload": ["--kv-offloading-size 32", "--kv-offloading-backend native"],
    "vllm-native-shared-fs": ['"spec_name":"TieringOffloadingSpec"', '"root_dir":"/mnt/kv"'],
    "vllm-lmcache-valkey": ["valkey-server", "LMCacheMPConnector", '"type":"resp"', "--http-port 8180"],
    "vllm-lmcache-mooncake": ["mooncake_master", '"type":"mooncake_store"'],
    "vllm-mooncake-store": ["MooncakeStoreConnector", "env MOONCAKE_CONFIG_PATH="],
    "vllm-pd-nixl": ["NixlConnector", "vllm-router", "--vllm-pd-disaggregation", "VLLM_NIXL_SIDE_CHANNEL_PORT"],
    "vllm-pd-mooncake": ['"kv_role":"kv_producer"', '"kv_role":"kv_consumer"', "VLLM_MOONCAKE_BOOTSTRAP_PORT"],
    "vllm-pd-nixl-native-offload": ["MultiConnector", "OffloadingConnector", "NixlConnector"],
    "vllm-pd-nixl-lmcache": ["LMCacheConnectorV1", "pd_role: sender", "pd_role: receiver", "disagg_proxy_server.py"],
    "vllm-pd-lmcache-store": ["LMCACHE_REQUEST_TELEMETRY_TYPE=fastapi", "disagg_prefill_mp"],
    "vllm-lmcache-mp": ["lmcache server", "--l1-size-gb 64", "LMCacheMPConnector"],
    "sglang-radix-off": ["sglang.launch_server", "--disable-radix-cache", "--enable-cache-report"],
    "sglang-radix": ["sglang.launch_server", "--enable-metrics"],
    "sglang-hicache-host": ["--enable-hierarchical-cache", "--hicache-size 64"],
    "sglang-hicache-file": ["--hicache-storage-backend file", "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR=/mnt/kv"],
    "sglang-hicache-mooncake": ["--hicache-storage-backend mooncake", "mooncake_master"],
    "sglang-pd-nixl": ["--disaggregation-mode prefill", "--disaggregation-transfer-backend nixl", "sglang_router"],
    "sglang-pd-mooncake": ["--disaggregation-transfer-backend mooncake", "--pd-disaggregation"],
    "sglang-pd-decode-offload": ["--disaggregation-decode-enable-offload-kvcache"],
    "trtllm-reuse-off": ["trtllm-serve", "enable_block_reuse: false"],
    "trtllm-reuse": ["enable_block_reuse: true", "enable_iter_perf_stats: true"],
    "trtllm-host-offload": ["host_cache_size: 68719476736"],
    "trtllm-pd-nixl": ["cache_transceiver_config", "backend: NIXL", "trtllm-serve disaggregated"],
    "trtllm-lmcache-valkey": ["kv_connector_config", "valkey-server"],
    "vllm-pd-mori": ["MoRIIOConnector", "--kv-connector moriio", "HIP_VISIBLE_DEVICES", "VLLM_ROCM_USE_AITER=1"],
    "sglang-hicache-mori": ["--hicache-storage-backend mori"],
    "sglang-pd-mori": ["--disaggregation-transfer-backend mori"],
}


@pytest.mark.parametrize(("stack", "needles"), sorted(EXPECTED.items()))
def test_recipe_has_the_engines_own_flags(stack: str, needles: list[str]) -> None:
    text = as_text(stack)
    for needle in needles:
        assert needle in text, (stack, needle)


def test_engines_split_gpus_by_tensor_parallel_size() -> None:
    ctx = context("vllm-prefix-gpu", gpus=8).model_copy(update={"engine": EngineSettings(tensor_parallel_size=4)})
    procs = render(ctx)["gpu-a"]
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in procs] == ["0,1,2,3", "4,5,6,7"]
    assert [p.ports["http"] for p in procs] == [8100, 8101]


@pytest.mark.parametrize("direct", [None, True, False])
def test_the_lmcache_disk_tier_uses_o_direct_unless_the_plan_says_not(direct: bool | None) -> None:
    """O_DIRECT keeps the disk tier's reads off the page cache; a plan turns it off where the filesystem refuses it
    (LMCache 0.5.1 then fails every write silently: seen on the H200 machine)."""
    ctx = context("vllm-lmcache-mp")
    sizing = dict(ctx.sizing) | ({} if direct is None else {"disk_tier_direct_io": direct})
    ctx = ctx.model_copy(update={"kv_tier": "nvme", "sizing": sizing})
    server = next(p for procs in render(ctx).values() for p in procs if p.role == "lmcache")
    adapters = [json.loads(server.argv[i + 1]) for i, a in enumerate(server.argv) if a == "--l2-adapter"]
    assert adapters == [{"type": "fs", "base_path": "/nvme/kv", "use_odirect": direct is not False}]


def test_the_lmcache_server_is_scraped_on_its_http_port() -> None:
    """`lmcache server` (LMCache 0.5.1, lmcache/v1/multiprocess/http_server.py) starts no Prometheus server of its
    own: its metrics are at the HTTP port's /metrics, where the agent must scrape them."""
    servers = [p for s in RECIPES if CATALOG[s].lmcache_server
               for procs in render(context(s)).values() for p in procs if p.role == "lmcache"]  # fmt: skip
    assert len(servers) >= 8  # the stacks that start one, on both machines
    for server in servers:
        assert server.metrics == (server.ports["http"], "/metrics")
        assert "--prometheus-port" not in server.argv


# What the engines' own code says about the rendered commands (found by the conformance suite, tools/conformance;
# each is the engine's own refusal or failure, kept here so the fix cannot regress without the engines installed).


def _procs(stack: str) -> list[tuple[str, list[str]]]:
    return [(p.name, p.argv) for procs in render(context(stack)).values() for p in procs]


@pytest.mark.parametrize("stack", ["vllm-lmcache-valkey", "trtllm-lmcache-valkey"])
def test_lmcache_valkey_tier_uses_the_adapter_both_lmcache_versions_register(stack: str) -> None:
    # LMCache 0.5.1: "unknown adapter type 'valkey'"; 0.5.6: "'valkey': startup_nodes is required"
    adapters = [
        json.loads(argv[i + 1])
        for name, argv in _procs(stack)
        if name == "lmcache"
        for i, a in enumerate(argv)
        if a == "--l2-adapter"
    ]
    assert adapters
    assert all(a["type"] == "resp" for a in adapters)
    assert all(isinstance(a["host"], str) and a["host"] and isinstance(a["port"], int) for a in adapters)


def test_sglang_decode_offload_does_not_enable_the_hierarchical_cache_decode_mode_forbids() -> None:
    # SGLang 0.5.20/0.5.23: "enable-hierarchical-cache and disable-radix-cache are mutually exclusive" on decode
    decoders = [argv for _, argv in _procs("sglang-pd-decode-offload") if "decode" in argv]
    assert decoders
    for argv in decoders:
        assert "--disaggregation-decode-enable-offload-kvcache" in argv
        assert "--enable-hierarchical-cache" not in argv
        assert "--hicache-storage-backend" in argv  # what decode offload requires instead


@pytest.mark.parametrize("stack", ["vllm-pd-lmcache-store", "vllm-pd-nixl-lmcache"])
def test_lmcache_proxies_listen_beyond_localhost(stack: str) -> None:
    # the scripts' --host defaults to localhost: prefill engines on another machine could not reach the proxy
    proxies = [argv for name, argv in _procs(stack) if name == "router"]
    assert proxies
    for argv in proxies:
        assert argv[argv.index("--host") + 1] == "0.0.0.0"


@pytest.mark.parametrize("stack", sorted(RECIPES))
def test_every_script_run_from_the_lmcache_examples_is_declared_host_code(stack: str) -> None:
    # LMCache 0.5.6's wheel has no examples/ and its published images only install the wheel: a proxy script run
    # from the examples folder is on the host (checked before start, mounted read-only into the image) or nowhere
    examples = "/opt/lmcache/examples/"
    for procs in render(context(stack)).values():
        for p in procs:
            scripts = [a for a in p.argv if a.startswith(examples)]
            assert sorted(scripts) == sorted(p.host_code), f"{stack} {p.name}: {p.argv[:2]} vs {p.host_code}"


def test_engines_per_cache_server_groups_the_pools_engines_around_their_servers() -> None:
    """Issue 19 (the study's section 4.3): a server per engine splits each machine's host memory and disk folder,
    on ports of its own; one server for four engines on two machines is reached over TCP from the other machine."""
    own = context("vllm-lmcache-mp").model_copy(
        update={"kv_tier": "nvme", "sizing": {**SIZING, "engines_per_cache_server": 1}}
    )
    out = render(own)
    servers = [p for p in out["gpu-a"] if p.role == "lmcache"]
    assert [s.name for s in servers] == ["lmcache", "lmcache-1"]
    assert [s.ports["zmq"] for s in servers] == [5555, 5556]
    assert all("--l1-size-gb 32 " in " ".join(s.argv) for s in servers)  # 64 GB split between two servers
    assert '"base_path":"/nvme/kv/server-0"' in " ".join(servers[0].argv)
    assert '"base_path":"/nvme/kv/server-1"' in " ".join(servers[1].argv)
    engines = [p for p in out["gpu-a"] if p.role == "engine"]
    assert ['"lmcache.mp.port":5555' in " ".join(e.argv) for e in engines] == [True, False]
    assert '"lmcache.mp.port":5556' in " ".join(engines[1].argv)

    shared = context("vllm-lmcache-mp").model_copy(update={"sizing": {**SIZING, "engines_per_cache_server": 4}})
    out = render(shared)
    assert [p.name for p in out["gpu-a"] if p.role == "lmcache"] == ["lmcache"]
    assert not [p for p in out["gpu-b"] if p.role == "lmcache"]
    remote = [" ".join(p.argv) for p in out["gpu-b"] if p.role == "engine"]
    assert remote
    assert all('"lmcache.mp.host":"tcp://10.0.0.1","lmcache.mp.port":5555' in argv for argv in remote)
    assert "--l1-size-gb 64 " in " ".join(next(p for p in out["gpu-a"] if p.role == "lmcache").argv)


def _engine_images(stack: str, version: str | None, vendor: str = "nvidia", gpu_model: str | None = None) -> set[str]:
    ctx = context(stack, vendor=vendor).model_copy(
        update={
            "engine": EngineSettings(name=stack.split("-", maxsplit=1)[0], version=version),
            "machines": [PoolMachine(name="gpu-a", host="10.0.0.1", gpus=2, vendor=vendor, gpu_model=gpu_model)],
        }
    )
    return {p.image or "" for procs in render(ctx).values() for p in procs if p.role == "engine"}


@pytest.mark.parametrize(
    ("stack", "version", "vendor", "gpu_model", "image"),
    [
        # vLLM's release scripts tag v<version> (they strip a leading v from the release and add it back)
        ("vllm-prefix-gpu", "0.28.0", "nvidia", "L40S", "vllm/vllm-openai:v0.28.0"),
        ("vllm-prefix-gpu", "v0.33.0", "nvidia", "H100", "vllm/vllm-openai:v0.33.0"),
        ("vllm-prefix-gpu", "0.25.1", "amd", "MI300X", "vllm/vllm-openai-rocm:v0.25.1"),
        # SGLang's release workflow: v<version>; its AMD images are per GPU family
        ("sglang-radix", "0.5.20", "nvidia", "H100", "lmsysorg/sglang:v0.5.20"),
        ("sglang-radix", "0.5.23", "amd", "MI300X", "lmsysorg/sglang:v0.5.23-rocm700-mi30x"),
        ("sglang-radix", "0.5.23", "amd", "MI355X", "lmsysorg/sglang:v0.5.23-rocm700-mi35x"),
        # NGC's TensorRT-LLM tags carry no v
        ("trtllm-reuse", "1.2.0", "nvidia", "H100", "nvcr.io/nvidia/tensorrt-llm/release:1.2.0"),
        # no version in the plan: the newest one the stack's recipe was checked on, never a moving tag
        ("vllm-prefix-gpu", None, "nvidia", "L40S", "vllm/vllm-openai:v0.33.0"),
        ("sglang-hicache-host", None, "amd", "MI325X", "lmsysorg/sglang:v0.5.23-rocm700-mi30x"),
    ],
)
def test_engine_images_are_tagged_as_each_project_publishes_them(
    stack: str, version: str | None, vendor: str, gpu_model: str, image: str
) -> None:
    assert _engine_images(stack, version, vendor, gpu_model) == {image}


TRTLLM_RECORDED = Path(__file__).resolve().parents[3] / "tools" / "conformance" / "recorded" / "trtllm.toml"


@pytest.mark.parametrize("stack", sorted(s for s in RECIPES if s.startswith("trtllm")))
def test_trtllm_configs_use_only_fields_tensorrt_llm_defines(stack: str) -> None:
    """TensorRT-LLM's LLM arguments are strict models (an unknown key is refused at start): every key of every
    rendered engine config must be one its source defines (tools/conformance/recorded/trtllm.toml, read off
    NVIDIA/TensorRT-LLM's llm_args.py), with a backend and connector preset it knows."""
    import tomllib  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    known = tomllib.loads(TRTLLM_RECORDED.read_text())["llm_args"]
    nested = {"kv_cache_config": "KvCacheConfig", "cache_transceiver_config": "CacheTransceiverConfig",
              "kv_connector_config": "KvCacheConnectorConfig"}  # fmt: skip
    engines = [p for procs in render(context(stack)).values() for p in procs if p.name.startswith("engine")]
    assert engines
    for process in engines:
        config = yaml.safe_load(next(iter(process.files.values())))
        assert set(config) <= set(known["top_level"]), set(config) - set(known["top_level"])
        for key, model in nested.items():
            assert set(config.get(key, {})) <= set(known[model]), (key, set(config.get(key, {})) - set(known[model]))
        assert config["return_perf_metrics"] is True  # else its per-request counters stay empty
        if "cache_transceiver_config" in config:
            assert config["cache_transceiver_config"]["backend"] in known["cache_transceiver_backends"]
        if "kv_connector_config" in config:
            assert config["kv_connector_config"]["connector"] in known["connector_presets"]


@pytest.mark.parametrize("stack", sorted(s for s in RECIPES if s.startswith("trtllm")))
def test_trtllm_serve_lines_use_only_options_every_release_takes(stack: str) -> None:
    """No TensorRT-LLM release is conformance-checked, so a plan may name any image: each `trtllm-serve` option
    a recipe passes must be one every release's click command declares (tools/conformance/recorded/trtllm.toml).
    `--config` is refused by 1.0 and 1.1 images ("No such option"); `--extra_llm_api_options` is taken by all."""
    import tomllib  # noqa: PLC0415

    serve = tomllib.loads(TRTLLM_RECORDED.read_text())["serve"]
    seen = 0
    for procs in render(context(stack)).values():
        for process in procs:
            if process.argv[0] != "trtllm-serve":
                continue
            seen += 1
            options = {a for a in process.argv if a.startswith("-")}
            allowed = serve["disaggregated_options_every_release"] if "disaggregated" in process.argv else []
            allowed = allowed or serve["options_every_release"]
            assert options <= set(allowed), (process.name, options - set(allowed))
            assert not options & set(serve["options_newer_only"]), process.name
    assert seen


def test_trtllm_nixl_backend_is_set_where_the_kv_moves() -> None:
    """TRTLLM_NIXL_KVCACHE_BACKEND is read by the engines' cache transceiver (its NIXL agent), so it belongs on
    every prefill and decode engine; the disaggregated proxy moves no KV and never reads it."""
    procs = [p for ps in render(context("trtllm-pd-nixl")).values() for p in ps]
    engines = [p for p in procs if "disaggregated" not in p.argv]
    assert engines
    assert all(p.env.get("TRTLLM_NIXL_KVCACHE_BACKEND") == "UCX" for p in engines)
    assert all("TRTLLM_NIXL_KVCACHE_BACKEND" not in p.env for p in procs if "disaggregated" in p.argv)


def test_trtllm_disaggregated_config_is_what_its_loader_reads() -> None:
    """`trtllm-serve disaggregated -c`: every top-level key is one extract_disagg_cfg names or an LLM argument it
    hands to both sections, and each section's urls are host:port, as many as num_instances (its own checks)."""
    import tomllib  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    recorded = tomllib.loads(TRTLLM_RECORDED.read_text())["disagg_config"]
    routers = [p for procs in render(context("trtllm-pd-nixl")).values() for p in procs if "disaggregated" in p.argv]
    assert len(routers) == 1
    config = yaml.safe_load(routers[0].files["disagg.yaml"])
    assert set(config) <= {*recorded["top_level"], *recorded["inherited_llm_args"]}, config
    for section in ("context_servers", "generation_servers"):
        servers = config[section]
        assert set(servers) <= set(recorded["server_section"]), servers
        assert len(servers["urls"]) == servers["num_instances"] > 0
        for url in servers["urls"]:
            host, port = url.split(":")
            assert host
            assert int(port) > 0


MOONCAKE_RECORDED = TRTLLM_RECORDED.with_name("mooncake.toml")
# the keys LMCache 0.5.1 and 0.5.6 keep for themselves; every other one goes to Mooncake
_LMCACHE_MOONCAKE_OWN = {"type", "num_workers", "eviction", "per_op_workers", "lookup_workers", "retrieve_workers",
                         "store_workers"}  # fmt: skip


@pytest.mark.parametrize("stack", ["vllm-lmcache-mooncake", "vllm-pd-lmcache-store"])
def test_lmcache_mooncake_adapters_give_mooncake_only_keys_its_client_reads(stack: str) -> None:
    """LMCache forwards its mooncake_store adapter's keys as-is to Mooncake's RealClient::setup_internal(ConfigDict):
    each must be one that function reads in every Mooncake release with it (recorded/mooncake.toml), the required
    local_hostname must be the server's own machine, and the master's address must be spelt master_server_addr
    (master_server_address is ignored: the client would connect to 127.0.0.1:50051)."""
    import tomllib  # noqa: PLC0415

    recorded = tomllib.loads(MOONCAKE_RECORDED.read_text())["setup_config"]
    releases = [set(v) for k, v in recorded.items() if isinstance(v, list) and k != "required"]
    read_everywhere = set.intersection(*releases)
    ctx = context(stack)
    hosts = {m.name: m.host for m in ctx.machines}
    seen = 0
    for machine, procs in render(ctx).items():
        for process in procs:
            if process.argv[:2] != ["lmcache", "server"]:
                continue
            for at, arg in enumerate(process.argv):
                if arg != "--l2-adapter":
                    continue
                adapter = json.loads(process.argv[at + 1])
                if adapter["type"] != "mooncake_store":
                    continue
                seen += 1
                forwarded = set(adapter) - _LMCACHE_MOONCAKE_OWN
                assert forwarded <= read_everywhere, forwarded - read_everywhere
                assert set(recorded["required"]) <= forwarded
                assert adapter["local_hostname"] == hosts[machine]
                assert adapter["master_server_addr"].endswith(":50051")
    assert seen >= 2


@pytest.mark.parametrize("stack", ["sglang-hicache-mooncake", "sglang-pd-decode-offload"])
def test_sglang_mooncake_engines_say_where_other_machines_reach_their_segment(stack: str) -> None:
    """SGLang's Mooncake client advertises localhost unless told (its MooncakeStoreConfig default): each engine's
    extra config names its own machine's address."""
    ctx = context(stack)
    hosts = {m.name: m.host for m in ctx.machines}
    seen = 0
    for machine, procs in render(ctx).items():
        for process in procs:
            if "--hicache-storage-backend-extra-config" in process.argv:
                extra = json.loads(process.argv[process.argv.index("--hicache-storage-backend-extra-config") + 1])
                assert extra["local_hostname"] == hosts[machine], (machine, extra)
                seen += 1
    assert seen >= 2


def _every_image(stack: str, version: str | None) -> dict[str, str]:
    """Process name -> image of every process ``stack`` renders on two machines, for a plan naming ``version``."""
    spec = get_stack(stack)
    assert spec is not None
    vendor = "amd" if tuple(spec.vendors) == ("amd",) else "nvidia"
    base = context(stack, vendor=vendor)
    ctx = base.model_copy(update={"engine": base.engine.model_copy(update={"version": version})})
    return {f"{machine}/{p.name}": p.image or "" for machine, procs in render(ctx).items() for p in procs}


@pytest.mark.parametrize("stack", sorted(RECIPES))
def test_no_process_runs_a_moving_image_tag(stack: str) -> None:
    """Every image the docker launcher would pull names a release: ``latest`` (or a major-only tag such as
    ``valkey:8``) moves under a run, and a later pull may no longer accept the rendered arguments."""
    spec = get_stack(stack)
    assert spec is not None
    # no release checked (TensorRT-LLM's): the planner refuses a real run that names none, so the plan names one
    checked = any(v.startswith(f"{spec.engine} ") for v in spec.validated_on)
    for name, image in _every_image(stack, None if checked else "1.2.0").items():
        tag = image.rsplit(":", 1)[-1] if ":" in image else ""
        assert tag not in ("", "latest"), f"{stack} {name}: {image!r}"
        assert "." in tag, f"{stack} {name}: {image!r} names a major version only"


def test_servers_beside_the_engines_run_pinned_releases_of_their_projects() -> None:
    valkey = _every_image("vllm-lmcache-valkey", "0.28.0")
    assert {v for k, v in valkey.items() if k.endswith("/valkey")} == {VALKEY_IMAGE}
    assert {v for k, v in valkey.items() if "lmcache" in k} == {f"lmcache/vllm-openai:v{LMCACHE_RELEASE}"}
    # a vLLM stack's Mooncake master comes from SGLang's image, at the newest SGLang the catalog was checked on
    master = _every_image("vllm-mooncake-store", "0.28.0")
    assert {v for k, v in master.items() if k.endswith("/mooncake-master")} == {
        f"lmsysorg/sglang:v{newest_checked('sglang')}"
    }
    # an SGLang stack's master (and its P/D router) follow the plan's SGLang
    pd = _every_image("sglang-hicache-mooncake", "0.5.20")
    assert {v for k, v in pd.items() if k.endswith("/mooncake-master")} == {"lmsysorg/sglang:v0.5.20"}
    router = _every_image("sglang-pd-mooncake", "0.5.20")
    assert {v for k, v in router.items() if k.endswith(("/router", "/mooncake-master"))} == {"lmsysorg/sglang:v0.5.20"}


def _pinned_by_the_conformance_suite(package: str) -> list[str]:
    envs = tomllib.loads((Path(__file__).resolve().parents[3] / "tools" / "conformance" / "envs.toml").read_text())
    return [
        pin.split("==")[1] for env in envs["env"].values() for pin in env["no_deps"]
        if pin.startswith(f"{package}==")
    ]  # fmt: skip


def test_the_lmcache_image_is_of_the_newest_lmcache_the_conformance_suite_checks() -> None:
    assert max(_pinned_by_the_conformance_suite("lmcache"), key=version_tuple) == LMCACHE_RELEASE


@pytest.mark.parametrize(("stack", "vllm"), [("vllm-pd-nixl", "0.28.0"), ("vllm-pd-mooncake", "0.25.1"),
                                             ("vllm-pd-mori", "0.28.0")])  # fmt: skip
def test_vllm_router_runs_from_its_own_image_at_the_release_the_conformance_suite_checks(stack: str, vllm: str) -> None:
    """vllm-router publishes its own image (``vllm/vllm-router:v<release>``, the Rust binary on the PATH); vLLM's
    image is not known to carry it. The router's release is the one whose parser the suite ran on the rendered
    arguments, whatever the plan's vLLM (and the same image on an AMD pool: the router uses no GPU)."""
    assert max(_pinned_by_the_conformance_suite("vllm-router"), key=version_tuple) == VLLM_ROUTER_RELEASE
    images = _every_image(stack, vllm)
    assert {v for k, v in images.items() if k.endswith("/router")} == {f"vllm/vllm-router:v{VLLM_ROUTER_RELEASE}"}
    assert {v for k, v in images.items() if not k.endswith("/router")} <= {
        f"vllm/vllm-openai:v{vllm}",
        f"vllm/vllm-openai-rocm:v{vllm}",
        f"lmsysorg/sglang:v{newest_checked('sglang')}",  # a Mooncake master beside the engines
    }


def test_what_a_real_run_needs_comes_from_the_plan_and_the_agent() -> None:
    """The agent's local model folder is served under the plan's id; the plan's engine variables go under kvbench's
    own; vLLM's development reset route is opened only for the acceptance test."""
    base = context("vllm-prefix-gpu").model_copy(
        update={
            "engine": EngineSettings(name="vllm", env={"VLLM_USE_FLASHINFER_SAMPLER": "0", "CUDA_VISIBLE_DEVICES": "7"})
        }
    )
    (engine, *_) = render(base)["gpu-a"]
    assert engine.argv[2] == "Qwen/Qwen3-8B"
    assert "--served-model-name" not in engine.argv
    assert engine.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert engine.env["CUDA_VISIBLE_DEVICES"] == "0"  # kvbench's GPU assignment wins over anything given
    assert "VLLM_SERVER_DEV_MODE" not in engine.env
    local = base.model_copy(update={"model_path": "/models/Qwen/Qwen3-8B", "open_reset_route": True})
    (engine, *_) = render(local)["gpu-a"]
    assert engine.argv[2] == "/models/Qwen/Qwen3-8B"
    assert engine.argv[engine.argv.index("--served-model-name") + 1] == "Qwen/Qwen3-8B"
    assert engine.env["VLLM_SERVER_DEV_MODE"] == "1"
    sglang = context("sglang-radix").model_copy(update={"model_path": "/models/Qwen/Qwen3-8B"})
    (engine, *_) = render(sglang)["gpu-a"]
    assert engine.argv[engine.argv.index("--model-path") + 1] == "/models/Qwen/Qwen3-8B"
    assert engine.argv[engine.argv.index("--served-model-name") + 1] == "Qwen/Qwen3-8B"


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize("stack", sorted(s for s in RECIPES if CATALOG[s].strategy in ("split", "split_offload")))
def test_the_processes_of_a_split_stack_agree_on_what_must_match(stack: str) -> None:
    """A prefill and a decode engine exchange KV by pages or blocks of one layout: the engines refuse a pair whose
    page size, block size, KV dtype or model differ (SGLang's disaggregation/common/conn.py: "Page size mismatch";
    vLLM's NIXL connector checks the block size and dtype in its handshake). Every split stack renders them alike."""
    engines = [p for procs in render(context(stack)).values() for p in procs if p.role in ("prefill", "decode")]
    assert {p.role for p in engines} == {"prefill", "decode"}
    for flag in ("--page-size", "--block-size", "--kv-cache-dtype", "--tokens-per-block"):
        assert len({_flag(p.argv, flag) for p in engines}) == 1, f"{stack}: {flag} differs between its engines"
    models = {p.argv[2] if p.argv[:2] == ["vllm", "serve"] else _flag(p.argv, "--model-path") for p in engines}
    assert len(models) == 1
