from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from kvbench_core.procs import free_port, pid_alive
from kvbench_node_agent.launchers.process import ProcessLauncher, docker_argv
from kvbench_node_agent.normalize import engine_kind, normalize
from kvbench_node_agent.preflight import check_binaries, check_model, check_ports, check_sizing
from kvbench_node_agent.scrape import parse_samples
from kvbench_stacks.catalog import CATALOG
from kvbench_stacks.recipes import EngineSettings, PoolMachine, ProcessSpec, RenderContext, render
from kvbench_stacks.recipes.model import Role

METRICS = Path(__file__).parent / "metrics"


def sample(name: str) -> dict[str, float]:
    return parse_samples((METRICS / name).read_text())


def test_vllm_offload_counters_by_tier() -> None:
    n = normalize(sample("vllm_offload.txt"))
    assert n["prompt_tokens"] == 100_000
    assert n["prompt_tokens_gpu"] == 40_000
    assert n["prompt_tokens_host"] == 30_000
    assert n["prompt_tokens_recomputed"] == 30_000
    assert n["kv_bytes_loaded_host"] == 4_423_680_000
    assert n["preemptions"] == 3
    assert n["kv_usage"] == pytest.approx(0.42)


def test_vllm_pd_decode_counts_transferred_tokens_once() -> None:
    n = normalize(sample("vllm_pd_decode.txt"), external="transferred")
    assert n["prompt_tokens_transferred"] == 44_000
    assert n.get("prompt_tokens_remote", 0) == 0
    assert n["prompt_tokens_gpu"] == 5_000
    assert n["prompt_tokens_recomputed"] == 1_000
    assert n["kv_bytes_transferred"] == 6_488_064_000
    assert n["kv_transfers"] == 120


REAL = METRICS / "vllm-0.25.1"


def real(name: str) -> dict[str, float]:
    return parse_samples((REAL / f"metrics-{name}.txt").read_text())


def test_real_vllm_0_25_1_prefix_cache_on_and_off() -> None:
    on = normalize(real("on"))
    # prompts sent twice: the second time 64,096 tokens came from the GPU prefix cache, 33,520 were computed
    assert (on["prompt_tokens"], on["prompt_tokens_gpu"], on["prompt_tokens_recomputed"]) == (97_616, 64_096, 33_520)
    assert on.get("prompt_tokens_host", 0) == on.get("prompt_tokens_remote", 0) == 0
    off = normalize(real("off"))
    assert (off["prompt_tokens"], off["prompt_tokens_gpu"], off["prompt_tokens_recomputed"]) == (64_016, 0, 64_016)
    small = normalize(real("smallgpu"))  # 8 prompts cycled through a cache of 3.6 of them: no hit at all
    assert (small["prompt_tokens_gpu"], small["prompt_tokens_recomputed"]) == (0, 128_016)


def test_real_vllm_0_25_1_native_cpu_offload_hits_are_the_host_tier() -> None:
    # vLLM 0.25.1 has no per-source counter: its offload hits arrive as "external" tokens, which the stack places
    offload = normalize(real("offload"), external=CATALOG["vllm-native-cpu-offload"].external_hits_tier("both"))
    assert offload["prompt_tokens_host"] == 64_000
    assert offload.get("prompt_tokens_transferred", 0) == 0  # not a P/D transfer, as the old reading had it
    assert (offload["prompt_tokens_gpu"], offload["prompt_tokens_recomputed"]) == (0, 64_016)
    assert offload["kv_bytes_loaded_host"] == 9_437_184_000
    assert offload["kv_bytes_stored_host"] == 9_439_543_296
    # a stack whose connector serves from more than one tier: the tokens stay unattributed, never filed as remote
    unknown = normalize(real("offload"), external=None)
    assert unknown["prompt_tokens_external"] == 64_000
    assert unknown.get("prompt_tokens_remote", 0) == 0


def test_each_stack_says_where_its_unattributed_hits_come_from() -> None:
    assert CATALOG["vllm-native-cpu-offload"].external_hits_tier("both") == "host"
    assert CATALOG["vllm-mooncake-store"].external_hits_tier("both") == "remote"
    assert CATALOG["vllm-pd-nixl"].external_hits_tier("decode") == "transferred"
    assert CATALOG["vllm-prefix-gpu"].external_hits_tier("both") is None


def test_mooncake_store_bytes_read_vllms_operation_labels() -> None:
    text = (
        "# TYPE vllm:mooncake_store_operation_bytes counter\n"
        'vllm:mooncake_store_operation_bytes_total{engine="0",operation="load_get"} 1000.0\n'
        'vllm:mooncake_store_operation_bytes_total{engine="0",operation="save_put"} 3000.0\n'
        'vllm:mooncake_store_operation_bytes_total{engine="0",operation="save_exists"} 7.0\n'
        "# TYPE vllm:prompt_tokens counter\n"
        'vllm:prompt_tokens_total{engine="0"} 10.0\n'
    )
    n = normalize(parse_samples(text))
    assert (n["kv_bytes_loaded_remote"], n["kv_bytes_stored_remote"]) == (1000, 3000)


def test_sglang_trtllm_and_lmcache() -> None:
    s = normalize(sample("sglang_hicache.txt"))
    assert (s["prompt_tokens_gpu"], s["prompt_tokens_host"], s["prompt_tokens_recomputed"]) == (30_000, 20_000, 30_000)
    assert s["kv_bytes_loaded_host"] == 2_949_120_000
    # SGLang's sglang:num_retracted_reqs is a gauge (2 now); the cumulative count is the _total counter
    assert s["preemptions"] == 5
    # HiCache in tokens, the kv pool's: what came back from host memory is what the host tier served
    assert (s["kv_tokens_loaded_host"], s["kv_tokens_stored_host"], s["kv_tokens_evicted"]) == (20_000, 52_000, 48_000)
    assert s["kv_tokens_loaded_host"] == s["prompt_tokens_host"]
    assert (s["host_tier_used_tokens"], s["host_tier_capacity_tokens"]) == (50_000, 262_144)
    assert "kv_tokens_loaded_remote" not in s  # no storage tier: absent, not 0
    assert engine_kind(sample("trtllm.txt")) == "trtllm"
    t = normalize(sample("trtllm.txt"))
    assert t["kv_bytes_stored_host"] == 2_000_000
    # TensorRT-LLM's cached tokens by the tier backing each cache level, not all of them filed as the GPU's
    assert (t["prompt_tokens_gpu"], t["prompt_tokens_host"], t["prompt_tokens_disk"]) == (12_000, 8_000, 0)
    assert (t["prompt_tokens"], t["prompt_tokens_recomputed"]) == (50_000, 30_000)
    assert (t["kv_blocks_reused"], t["kv_blocks_missed"], t["kv_usage"]) == (625, 937, 0.42)


def test_trtllm_reads_are_families_tensorrt_llm_defines_with_their_types() -> None:
    """No TensorRT-LLM runs here: its MetricsCollector's families were read off its source (recorded with the
    commit); every TensorRT-LLM series the normaliser reads must be one of them, of the same type."""
    import tomllib  # noqa: PLC0415

    from kvbench_node_agent.engine_metrics import reads_of  # noqa: PLC0415

    recorded = Path(__file__).resolve().parents[3] / "tools" / "conformance" / "recorded" / "trtllm.toml"
    metrics = tomllib.loads(recorded.read_text())["metrics"]
    families: dict[str, str] = metrics["families"]
    reads = reads_of("trtllm")
    assert reads
    for read in reads:
        assert families.get(read.family) == read.kind, (read.family, families.get(read.family), read.kind)
        # the label values it is selected by: the tiers the collector writes (no wheel to scan, so recorded)
        for name, values in read.labels:
            assert name == "cache_tier"
            assert set(values) <= set(metrics["cache_tiers"]), values


def test_sglang_0_5_23s_own_exporter_text_reads_back_its_figures() -> None:
    """A text SGLang's own collectors wrote (the conformance suite makes it again for every SGLang it checks): one
    request of 8,000 prompt tokens, 3,000 cached on the GPU and 2,000 in host memory, HiCache's movements."""
    n = normalize(sample("sglang-0.5.23/exporter.txt"))
    assert engine_kind(sample("sglang-0.5.23/exporter.txt")) == "sglang"
    assert (n["prompt_tokens"], n["prompt_tokens_gpu"], n["prompt_tokens_host"]) == (8000, 3000, 2000)
    assert n["prompt_tokens_recomputed"] == 3000
    assert (n["kv_tokens_loaded_host"], n["kv_tokens_stored_host"], n["kv_tokens_evicted"]) == (2000, 4000, 3000)
    assert (n["kv_tokens_loaded_remote"], n["kv_tokens_stored_remote"]) == (500, 700)


def test_the_nixl_read_is_a_counter_its_prometheus_exporter_defines() -> None:
    import tomllib  # noqa: PLC0415

    from kvbench_node_agent.normalize import engine_kind  # noqa: PLC0415

    recorded = Path(__file__).resolve().parents[3] / "tools" / "conformance" / "recorded" / "nixl.toml"
    counters = tomllib.loads(recorded.read_text())["exporter"]["counters"]
    text = "".join(f'# TYPE {c} counter\n{c}{{hostname="h",agent_name="a"}} 1000.0\n' for c in counters)
    assert engine_kind(parse_samples(text)) == "nixl"
    assert normalize(parse_samples(text))["kv_bytes_transferred"] == 1000.0  # agent_tx_bytes_total


def test_vllm_hit_rate_denominators_from_a_real_0_25_1_text() -> None:
    """vLLM's own queries counters (tokens asked of its GPU prefix cache and of its KV connector) beside its hits:
    the denominators of the hit rates the report gives, from a real vLLM 0.25.1 /metrics text."""
    n = normalize(sample("lmcache-0.5.1/vllm_metrics_lmc2.txt"), external=None)
    assert n["prefix_cache_queries"] == 32_656_016
    assert 0 <= n["prefix_cache_hits"] <= n["prefix_cache_queries"]
    assert 0 < n["external_cache_hits"] <= n["external_cache_queries"]


def test_lmcache_0_5_1_real_counters_give_hits_by_tier_and_the_l2_writes() -> None:
    """Real texts of LMCache 0.5.1's MP server (H200, 2026-12-01): a fresh start whose second round came from L1,
    a restart whose prompts came from the disk tier, and a run whose every O_DIRECT disk write failed silently."""
    fresh = normalize(sample("lmcache-0.5.1/lmc_metrics_run1.txt"))
    assert engine_kind(sample("lmcache-0.5.1/lmc_metrics_run1.txt")) == "lmcache"
    assert (fresh["cache_server_hit_tokens_host"], fresh["cache_server_hit_tokens_disk"]) == (63_488, 0)
    assert (fresh["kv_store_chunks_submitted"], fresh["kv_store_chunks_completed"]) == (248, 248)
    restarted = normalize(sample("lmcache-0.5.1/lmc_metrics_run2.txt"))
    assert (restarted["cache_server_hit_tokens_host"], restarted["cache_server_hit_tokens_disk"]) == (0, 126_976)
    broken = normalize(sample("lmcache-0.5.1/odirect_true_lmc_metrics_run1.txt"))
    assert (broken["kv_store_chunks_submitted"], broken["kv_store_chunks_completed"]) == (248, 0)
    # the server is not an engine: it adds no prompt token source of its own (the engines' hits are split by it)
    assert not [k for k in (fresh | restarted | broken) if k.startswith("prompt_tokens")]
    # and vLLM 0.25.1 beside it counts the same hits, as its connector's (unattributed: no per-source counter)
    vllm = normalize(sample("lmcache-0.5.1/vllm_metrics_lmc2.txt"), external=None)
    assert vllm["prompt_tokens_external"] == restarted["cache_server_hit_tokens_disk"]


def test_lmcache_0_5_6_splits_its_hits_by_tier_itself_and_counts_l2_evictions() -> None:
    """LMCache 0.5.6 adds lookup_hit_l1/_l2 (tokens; l1 + l2 == hit): read directly, not through 0.5.1's chunk
    ratio. Hand-written text: no real 0.5.6 run is recorded; the names are checked against 0.5.6's own
    instruments by the conformance suite (tools/conformance, engine "lmcache")."""
    labels = '{cache_salt="",model_name="m"}'
    text = "\n".join([
        f"lmcache_mp_lookup_hit_tokens_total{labels} 1000.0",
        f"lmcache_mp_lookup_hit_l1_tokens_total{labels} 400.0",
        f"lmcache_mp_lookup_hit_l2_tokens_total{labels} 600.0",
        "lmcache_mp_num_chunks_loaded_total 10.0",
        "lmcache_mp_l2_prefetch_load_completed_chunks_total 1.0",  # the 0.5.1 ratio would say 100 from disk
        "lmcache_mp_l2_store_submitted_objects_chunks_total 8.0",
        "lmcache_mp_l2_store_completed_objects_chunks_total 8.0",
        "lmcache_mp_l2_evicted_objects_chunks_total 3.0",
    ])  # fmt: skip
    split = normalize(parse_samples(text + "\n"))
    assert (split["cache_server_hit_tokens_host"], split["cache_server_hit_tokens_disk"]) == (400, 600)
    assert split["kv_store_chunks_evicted"] == 3
    # OpenTelemetry exports a counter only once it moved: every hit from L2 leaves no l1 series
    only_disk = "\n".join(line for line in text.splitlines() if "_l1_" not in line)
    split = normalize(parse_samples(only_disk + "\n"))
    assert (split["cache_server_hit_tokens_host"], split["cache_server_hit_tokens_disk"]) == (0, 600)
    # 0.5.1 never evicted from L2 in the recorded runs: no series, and 0 evicted
    assert normalize(sample("lmcache-0.5.1/lmc_metrics_run1.txt"))["kv_store_chunks_evicted"] == 0


def test_preflight_names_the_machine_and_the_fix(tmp_path: Path) -> None:
    spec = ProcessSpec(
        name="engine-0",
        role="engine",
        argv=["vllm"],
        health=("http", 1, "/"),
        binary="definitely-not-installed-xyz",
        ports={"http": free_port()},
    )
    missing = check_binaries("gpu-a", [spec], "process")
    assert missing[0].machine == "gpu-a"
    assert "definitely-not-installed-xyz is not installed" in str(missing[0])
    assert "Fix: Install" in str(missing[0])
    issues = check_sizing(
        "gpu-b", {"disk_tier_path": str(tmp_path / "absent"), "disk_tier_gb": 1, "host_memory_gb": 900}, ram_gb=1000
    )
    assert {i.check for i in issues} == {"disk_tier_path", "host_memory_gb"}
    assert all(i.machine == "gpu-b" for i in issues)
    assert "does not exist" in str(issues[0])
    assert check_model("gpu-a", "meta-llama/Llama-3.1-8B", has_token=False)[0].check == "model"
    assert check_model("gpu-a", "Qwen/Qwen3-8B", has_token=False) == []


def test_the_model_is_found_on_the_machine_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvbench_node_agent.models import ModelLocation, resolve_model  # noqa: PLC0415
    from kvbench_node_agent.preflight import PreflightIssue  # noqa: PLC0415

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    missing = resolve_model("gpu-a", "Qwen/Qwen3-8B", {}, None)
    assert isinstance(missing, PreflightIssue)
    assert missing.check == "model"
    assert missing.machine == "gpu-a"
    assert "huggingface-cli download Qwen/Qwen3-8B" in str(missing)
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "tokenizer.json").write_text("{}")
    # a config and a tokenizer without weights: enough only for random weights
    assert isinstance(resolve_model("gpu-a", "Qwen/Qwen3-8B", {}, None), PreflightIssue)
    found = resolve_model("gpu-a", "Qwen/Qwen3-8B", {"load_format": "dummy"}, None)
    assert found == ModelLocation(None, f"the Hugging Face cache: {snapshot}")  # the engine finds the id itself
    (snapshot / "model.safetensors").write_bytes(b"")
    assert isinstance(resolve_model("gpu-a", "Qwen/Qwen3-8B", {}, None), ModelLocation)
    # the operator's model folder comes first, and the engine then loads that folder
    local = tmp_path / "models" / "Qwen" / "Qwen3-8B"
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    lacking = resolve_model("gpu-a", "Qwen/Qwen3-8B", {"load_format": "dummy"}, str(tmp_path / "models"))
    assert isinstance(lacking, PreflightIssue)
    assert "lacks a tokenizer" in lacking.message
    (local / "tokenizer.json").write_text("{}")
    dummy = resolve_model("gpu-a", "Qwen/Qwen3-8B", {"load_format": "dummy"}, str(tmp_path / "models"))
    assert isinstance(dummy, ModelLocation)
    assert dummy.path == str(local)
    # a plan's own absolute folder
    assert resolve_model("gpu-a", str(local), {"load_format": "dummy"}, None) == ModelLocation(
        str(local), f"the plan's local folder: {local}"
    )


def test_preflight_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec = ProcessSpec(
            name="engine-0", role="engine", argv=["x"], health=("http", port, "/"), binary="x", ports={"http": port}
        )
        issues = check_ports("gpu-a", [spec])
    assert issues
    assert f"port {port}" in issues[0].message


def test_docker_commands_for_gpus_rdma_and_secrets(tmp_path: Path) -> None:
    ctx = RenderContext(
        stack="vllm-pd-nixl",
        model="Qwen/Qwen3-8B",
        engine=EngineSettings(version="0.28.0"),
        sizing={"prefill_machines": 1},
        network={"rdma_device": "mlx5_0"},
        machines=[PoolMachine(name="a", host="10.0.0.1", gpus=1), PoolMachine(name="b", host="10.0.0.2", gpus=1)],
    )
    spec = render(ctx)["a"][0]
    argv = docker_argv(spec, "dep1", tmp_path, rdma=True, secret_names=["HF_TOKEN"])
    text = " ".join(argv)
    assert text.startswith("docker run -d --rm --name kvbench-dep1-engine-0 --network host --ipc host")
    assert '--gpus "device=0"' in text
    assert "--device /dev/infiniband --ulimit memlock=-1" in text
    # vLLM's release tag, and the recipe's command as it is: the image's own entrypoint (`vllm serve`) replaced
    assert "--entrypoint vllm vllm/vllm-openai:v0.28.0 serve Qwen/Qwen3-8B" in text
    # the token's name only: docker takes its value from its own environment, never from the command line
    assert argv[argv.index("HF_TOKEN") - 1] == "-e"
    assert "HF_TOKEN=" not in text
    amd = docker_argv(spec.model_copy(update={"image": "vllm/vllm-openai-rocm:0.28.0"}), "d", tmp_path, vendor="amd")
    assert "--device /dev/kfd" in " ".join(amd)


def test_an_engine_container_gets_the_model_cache_the_preflight_looked_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preflight found the weights in the agent's Hugging Face cache; the container must see that same cache
    (an agent in a container sets HF_HOME to the host's path, and docker mounts host paths), not the agent
    process's home, which in a container is not the host's."""
    spec = ProcessSpec(name="engine-0", role="engine", health=("http", 8000, "/health"), binary="vllm",
                       argv=["vllm", "serve", "m"], image="vllm/vllm-openai:v0.28.0")  # fmt: skip
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", "/home/lab/.cache/huggingface")
    argv = docker_argv(spec, "d", tmp_path)
    assert argv[argv.index("/home/lab/.cache/huggingface/hub:/root/.cache/huggingface/hub") - 1] == "-v"
    monkeypatch.setenv("HF_HUB_CACHE", "/models/hub")
    assert "/models/hub:/root/.cache/huggingface/hub" in docker_argv(spec, "d", tmp_path)


async def test_process_launcher_starts_health_checks_and_stops_a_bare_engine(tmp_path: Path) -> None:
    port = free_port()
    spec = ProcessSpec(
        name="engine-0",
        role="engine",
        health=("http", port, "/health"),
        metrics=(port, "/metrics"),
        binary=sys.executable,
        ports={"http": port},
        serves_requests=True,
        argv=[sys.executable, "-m", "kvbench_sim", "serve", "--port", str(port), "--gpu", "H100"],
        files={"note.txt": "written before start"},
    )
    launcher = ProcessLauncher("process", "n0", "127.0.0.1", tmp_path, health_timeout_s=60)
    deployment = await launcher.start_specs("dep1", "R", "vllm-prefix-gpu", [spec])
    pid = deployment.processes[0].proc.pid
    try:
        assert pid_alive(pid)
        assert deployment.endpoints[0].base_url == f"http://127.0.0.1:{port}"
        assert deployment.facts["engine-0.attention_block_size"] == 16
        assert (tmp_path / "runs" / "dep1" / "note.txt").read_text() == "written before start"
    finally:
        await launcher.stop(deployment)
    assert not pid_alive(pid)


async def test_the_engines_restart_alone_and_the_cache_server_keeps_running(tmp_path: Path) -> None:
    """The acceptance test's reset step for an engine with no reset route: the engine process is stopped and
    started again as it was (a new pid, healthy), the cache server beside it is not touched."""

    def serving(name: str, role: Role) -> ProcessSpec:
        port = free_port()
        argv = [sys.executable, "-m", "kvbench_sim", "serve", "--port", str(port), "--gpu", "H100"]
        return ProcessSpec(name=name, role=role, health=("http", port, "/health"), binary=sys.executable,
                           ports={"http": port}, argv=argv, metrics=(port, "/metrics"),
                           serves_requests=role == "engine")  # fmt: skip

    launcher = ProcessLauncher("process", "n0", "127.0.0.1", tmp_path, health_timeout_s=60)
    cache, first = serving("lmcache", "lmcache"), serving("engine-0", "engine")
    deployment = await launcher.start_specs("dep3", "R", "vllm-lmcache-mp", [cache, first])
    server, engine = (p.proc.pid for p in deployment.processes)
    # the cache server's own counters are read beside the engine's, and it is never sent a request
    assert deployment.scrape_only == [("lmcache", f"http://127.0.0.1:{cache.metrics[0]}/metrics")]  # type: ignore[index]
    assert [e.engine_id for e in deployment.endpoints] == ["n0-engine-0"]
    try:
        restarted, kept = await deployment.restart_engines()
        assert (restarted, kept) == (["engine-0"], ["lmcache"])
        assert deployment.processes[0].proc.pid == server  # the cache server still runs, the same process
        assert pid_alive(server)
        assert not pid_alive(engine)
        assert deployment.processes[1].proc.pid != engine  # a new engine, healthy when restart_engines returned
        assert pid_alive(deployment.processes[1].proc.pid)
    finally:
        await launcher.stop(deployment)
    assert not any(pid_alive(p.proc.pid) for p in deployment.processes)


async def test_a_process_that_dies_at_start_is_a_clear_failure(tmp_path: Path) -> None:
    from kvbench_node_agent.launchers.base import LaunchError  # noqa: PLC0415

    port = free_port()
    spec = ProcessSpec(
        name="engine-0",
        role="engine",
        health=("http", port, "/health"),
        binary=sys.executable,
        argv=[sys.executable, "-c", "import sys; print('boom: CUDA out of memory'); sys.exit(3)"],
    )
    launcher = ProcessLauncher("process", "gpu-a", "127.0.0.1", tmp_path, health_timeout_s=30)
    with pytest.raises(LaunchError, match="gpu-a: engine-0 exited with code 3"):
        await launcher.start_specs("dep2", "R", "s", [spec])


def test_ethtool_pause_pfc_ecn_and_fec_are_read_from_the_drivers_names() -> None:
    from kvbench_node_agent.fabric import parse_ethtool_stats, parse_fec  # noqa: PLC0415

    # `ethtool -S` of an mlx5 port (names from the kernel's mlx5 counters documentation), trimmed
    text = """NIC statistics:
     rx_packets: 1804
     rx_bytes_phy: 123456789
     tx_bytes_phy: 98765432
     rx_pause_ctrl_phy: 7
     tx_pause_ctrl_phy: 0
     rx_prio3_pause: 5000
     tx_prio3_pause: 40
     rx_prio3_pause_duration: 123
     rx_prio3_marked: 17
     rx_discards_phy: 2
"""
    read = {(counter, tuple(q.items())): value for counter, _, value, q, _ in parse_ethtool_stats(text)}
    assert read == {
        ("if.in_octets_phy", ()): 123456789,
        ("if.out_octets_phy", ()): 98765432,
        ("pause.rx_frames", ()): 7,
        ("pause.tx_frames", ()): 0,
        ("pfc.rx_frames", (("priority", 3),)): 5000,
        ("pfc.tx_frames", (("priority", 3),)): 40,
        ("ecn.marked_packets", (("priority", 3),)): 17,
        ("if.in_discards_phy", ()): 2,
    }
    fec = "FEC parameters for eth1:\nSupported/Configured FEC encodings: Auto RS\nActive FEC encoding: RS\n"
    assert parse_fec(fec + "Statistics:\n  Corrected blocks: 10\n  Uncorrectable blocks: 3\n") == ("rs", 3)
    assert parse_fec("Active FEC encoding: Off\n") == ("off", None)
    assert parse_fec("") == (None, None)


def test_connector_tokens_split_into_cache_tiers_and_pd_transfers() -> None:
    """With per-source cache counters, external_kv_transfer holds every connector token: the part no tier accounts
    for came from a prefill engine; an LMCache engine's disk loads are never called transfers."""

    def normalized(disk: float, host: float, external: float) -> dict[str, float]:
        text = f"""# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{engine="0",model_name="m"}} 10000.0
# TYPE vllm:prompt_tokens_cached_by_source counter
vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="m",source="device"}} 1000.0
vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="m",source="disk"}} {disk}
vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="m",source="host"}} {host}
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="external_kv_transfer"}} {external}
vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="local_compute"}} {9000.0 - external}
"""
        return normalize(parse_samples(text), "vllm")

    lmcache = normalized(disk=6000.0, host=1000.0, external=7000.0)
    assert (lmcache["prompt_tokens_disk"], lmcache["prompt_tokens_transferred"]) == (6000.0, 0.0)
    assert lmcache["prompt_tokens_recomputed"] == 2000.0
    pd_with_offload = normalized(disk=0.0, host=1500.0, external=8000.0)
    assert pd_with_offload["prompt_tokens_transferred"] == 6500.0
    assert pd_with_offload["prompt_tokens_host"] == 1500.0


def test_a_live_cpu_offload_run_normalises_to_the_hits_and_bytes_the_engine_served() -> None:
    """The live H200 run of vllm-native-cpu-offload (data/live/2026-12-01-h200-vllm-0.25.1): what the normaliser
    reads from the engine's own /metrics agrees with the requests' usage, and the bytes per token with the model
    table's KV size."""
    from kvbench_stacks.hardware import find_model  # noqa: PLC0415

    live = METRICS.parents[3] / "data" / "live" / "2026-12-01-h200-vllm-0.25.1"
    counters = normalize(parse_samples((live / "metrics-vllm-native-cpu-offload.txt").read_text()), external="host")
    result = json.loads((live / "live-vllm-native-cpu-offload.json").read_text())
    assert counters["prompt_tokens_host"] == result["rounds"]["round2"]["cached_tokens"] == 63_920
    model = find_model("Qwen/Qwen3-8B")
    assert model is not None
    assert counters["kv_bytes_loaded_host"] == counters["prompt_tokens_host"] * model.kv_bytes_per_token
    evicted = normalize(parse_samples((live / "metrics-vllm-prefix-gpu.txt").read_text()))
    assert evicted["prompt_tokens_gpu"] == 0  # the 4 GiB GPU cache kept no document until its second visit


def test_the_live_lmcache_run_reads_as_the_server_and_the_engine_counted_it() -> None:
    """The live H200 run of vllm-lmcache-mp: the LMCache server's counters, scraped on its HTTP port, say its hits
    came from L1 and all its disk writes completed; vLLM's say the same number of connector hits."""
    live = METRICS.parents[3] / "data" / "live" / "2026-12-01-h200-vllm-0.25.1"
    server = normalize(parse_samples((live / "metrics-vllm-lmcache-mp-lmcache.txt").read_text()))
    engine = normalize(parse_samples((live / "metrics-vllm-lmcache-mp-vllm.txt").read_text()), external=None)
    result = json.loads((live / "live-vllm-lmcache-mp.json").read_text())
    assert server["cache_server_hit_tokens_host"] == engine["prompt_tokens_external"]
    assert server["cache_server_hit_tokens_host"] == result["rounds"]["round2"]["cached_tokens"] == 63_488
    assert server["kv_store_chunks_completed"] == server["kv_store_chunks_submitted"] == result["disk_tier"]["files"]
    restarted = result["after_restart"]["normalized_delta"][1]
    assert restarted["cache_server_hit_tokens_disk"] == result["after_restart"]["rounds"]["round1"]["cached_tokens"]
