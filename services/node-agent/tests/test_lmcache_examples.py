"""LMCache's P/D proxy scripts: fetched onto the host (no LMCache image or wheel holds them), checked before a
stack starts, and mounted read-only into the image that runs them."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from kvbench_node_agent import cli
from kvbench_node_agent.launchers.process import docker_argv
from kvbench_node_agent.lmcache_examples import archive_url, extract_examples, fetch
from kvbench_node_agent.preflight import check_host_code
from kvbench_stacks.recipes import EngineSettings, PoolMachine, ProcessSpec, RenderContext, render
from kvbench_stacks.recipes.images import LMCACHE_RELEASE

PROXY = "disagg_prefill_mp/disagg_proxy_server.py"


def source_archive(files: dict[str, bytes], top: str = f"LMCache-{LMCACHE_RELEASE}") -> bytes:
    """A tarball shaped like GitHub's source archive of a tag: everything under one top folder."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def proxy_spec(examples: Path | None = None) -> ProcessSpec:
    args = {"lmcache_examples": str(examples)} if examples else {}
    ctx = RenderContext(
        stack="vllm-pd-lmcache-store",
        model="Qwen/Qwen3-8B",
        engine=EngineSettings(version="0.28.0", args=args),
        kv_tier="cpu_ram",
        sizing={"prefill_machines": 1, "host_memory_gb": 8, "shared_store_gb": 8},
        routing="pd_aware",
        machines=[PoolMachine(name="a", host="10.0.0.1", gpus=1), PoolMachine(name="b", host="10.0.0.2", gpus=1)],
    )
    (proxy,) = [p for procs in render(ctx).values() for p in procs if p.name == "router"]
    return proxy


def test_the_proxy_script_is_host_code_the_docker_launcher_mounts_read_only(tmp_path: Path) -> None:
    proxy = proxy_spec()
    script = f"/opt/lmcache/examples/{PROXY}"
    assert proxy.argv[:2] == ["python3", script]
    assert proxy.host_code == [script]
    argv = docker_argv(proxy, "dep1", tmp_path)
    folder = "/opt/lmcache/examples/disagg_prefill_mp"
    assert argv[argv.index(f"{folder}:{folder}:ro") - 1] == "-v"
    # mounted before the image: options after it would be the container's command line
    assert argv.index(f"{folder}:{folder}:ro") < argv.index(f"lmcache/vllm-openai:v{LMCACHE_RELEASE}")


def test_preflight_wants_the_proxy_script_on_the_machine_and_says_how_to_fetch_it(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    proxy = proxy_spec(examples)
    (issue,) = check_host_code("gpu-a", [proxy])
    assert issue.machine == "gpu-a"
    assert str(examples / PROXY) in issue.message
    assert f"kvbench-agent --fetch-lmcache-examples {examples}" in issue.fix
    (examples / PROXY).parent.mkdir(parents=True)
    (examples / PROXY).write_text("# the proxy\n")
    assert check_host_code("gpu-a", [proxy]) == []


def test_fetching_keeps_only_the_examples_of_the_release_archive(tmp_path: Path) -> None:
    dest = tmp_path / "lmcache" / "examples"
    dest.mkdir(parents=True)
    (dest / "stale.py").write_text("from an older release")
    archive = source_archive({f"examples/{PROXY}": b"print('proxy')\n", "lmcache/__init__.py": b"", "README.md": b""})
    asked: list[str] = []

    def download(url: str) -> bytes:
        asked.append(url)
        return archive

    done = fetch(dest, download=download)
    assert asked == [f"https://github.com/LMCache/LMCache/archive/refs/tags/v{LMCACHE_RELEASE}.tar.gz"]
    assert asked == [archive_url()]
    assert (dest / PROXY).read_text() == "print('proxy')\n"
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [PROXY]
    assert f"1 files in {dest}" in done
    assert oct(dest.stat().st_mode & 0o777) == "0o755"


def test_a_bad_archive_changes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "examples"
    (dest / "disagg_prefill").mkdir(parents=True)
    (dest / "disagg_prefill" / "disagg_proxy_server.py").write_text("kept")
    with pytest.raises(ValueError, match="no examples/ folder"):
        extract_examples(source_archive({"README.md": b"not LMCache"}), dest)
    with pytest.raises(tarfile.TarError):  # a member that would land outside the folder
        extract_examples(source_archive({"examples/ok.py": b"", "examples/../../escape.py": b"x"}), dest)
    assert (dest / "disagg_prefill" / "disagg_proxy_server.py").read_text() == "kept"
    assert not (tmp_path / "escape.py").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["examples"]  # no staging folder left behind


def test_the_agent_fetches_then_exits_without_a_bus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = source_archive({f"examples/{PROXY}": b""})
    monkeypatch.setattr("kvbench_node_agent.lmcache_examples._download", lambda url: archive)
    with pytest.raises(SystemExit) as exited:
        cli.main(["--fetch-lmcache-examples", str(tmp_path / "ex")])
    assert exited.value.code == 0
    assert (tmp_path / "ex" / PROXY).is_file()
    assert "examples: 1 files" in capsys.readouterr().out

    def unreachable(url: str) -> bytes:
        raise OSError("Network is unreachable")

    monkeypatch.setattr("kvbench_node_agent.lmcache_examples._download", unreachable)
    with pytest.raises(SystemExit) as exited:
        cli.main(["--fetch-lmcache-examples", str(tmp_path / "ex")])
    assert exited.value.code == 1
    assert "could not fetch LMCache's examples: Network is unreachable" in capsys.readouterr().err
    assert (tmp_path / "ex" / PROXY).is_file()  # the previous fetch is kept
