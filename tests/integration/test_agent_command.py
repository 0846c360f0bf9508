"""`kvbench-agent` on a GPU machine: it refuses what a person must fix with the setting and the fix, joins a bus
that wants a token only with that token, and shows up heartbeating."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from kvbench_contracts.node import Heartbeat
from kvbench_core.bus import Bus, NatsAuth
from kvbench_core.embedded import EmbeddedNats

pytestmark = pytest.mark.integration

AGENT = [sys.executable, "-m", "kvbench_node_agent.cli"]


def agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVBENCH_")}
    return subprocess.run([*AGENT, *args], capture_output=True, text=True, timeout=60, env={**clean, **(env or {})},
                          check=False)  # fmt: skip


@pytest.fixture
def guarded_bus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A NATS that wants a token, and the token's file (as `kvbench up` writes it)."""
    token_file = tmp_path / "nats-token"
    token_file.write_text("s3cret-token-for-the-test\n")
    token_file.chmod(0o600)
    server = EmbeddedNats(tmp_path / "nats", token="s3cret-token-for-the-test").start()
    try:
        yield server.url, token_file
    finally:
        server.stop()


def test_an_unreachable_bus_is_refused_with_the_flag_and_the_fix(tmp_path: Path) -> None:
    result = agent("--nats", "nats://127.0.0.1:1", "--node-id", "gpu1", "--state-dir", str(tmp_path), "--check")
    assert result.returncode == 2
    assert "--nats (KVBENCH_NATS_URL): nothing answers at 127.0.0.1:1" in result.stderr
    assert "kvbench up --listen" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_names_and_an_unwritable_state_dir_are_refused(tmp_path: Path) -> None:
    bad_group = agent("--nats", "nats://127.0.0.1:1", "--group", "Lab One", "--state-dir", str(tmp_path), "--check")
    assert bad_group.returncode == 2
    assert "KVBENCH_NODE_AGENT_GROUP" in bad_group.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    no_dir = agent("--nats", "nats://127.0.0.1:1", "--state-dir", str(blocked / "sub"), "--check")
    assert no_dir.returncode == 2
    assert "--state-dir (KVBENCH_NODE_AGENT_STATE_DIR)" in no_dir.stderr
    config = tmp_path / "agent.env"
    config.write_text("# comment\nKVBENCH_NATS_URL=nats://127.0.0.1:1\nnot a setting\n")
    bad_file = agent("--config", str(config), "--check")
    assert bad_file.returncode == 2
    assert "line 3 is not KVBENCH_NAME=value" in bad_file.stderr
    # a bus user made for another machine: refused before anything connects, naming the node id it was made for
    password = tmp_path / "password"
    password.write_text("x")
    other = agent("--nats", "nats://127.0.0.1:1", "--node-id", "gpu2", "--nats-user", "agent-gpu1",
                  "--nats-password-file", str(password), "--state-dir", str(tmp_path), "--check")  # fmt: skip
    assert other.returncode == 2
    assert "--node-id (KVBENCH_NODE_AGENT_NODE_ID)" in other.stderr
    assert "pass --node-id gpu1" in other.stderr


def test_the_token_decides_and_the_agent_heartbeats(guarded_bus: tuple[str, Path], tmp_path: Path) -> None:
    url, token_file = guarded_bus
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-it\n")
    refused = agent("--nats", url, "--nats-token-file", str(wrong), "--state-dir", str(tmp_path / "a"), "--check")
    assert refused.returncode == 2
    assert "--nats-token-file (KVBENCH_NATS_TOKEN_FILE): the bus at" in refused.stderr
    assert "not-it" not in refused.stderr  # the token is never echoed

    # settings from a config file, with a flag over it
    config = tmp_path / "agent.env"
    config.write_text(f"KVBENCH_NATS_URL={url}\nKVBENCH_NATS_TOKEN_FILE={token_file}\nKVBENCH_NODE_AGENT_GROUP=lab\n")
    ok = agent("--config", str(config), "--node-id", "gpu-7", "--state-dir", str(tmp_path / "a"), "--check")
    assert ok.returncode == 0, ok.stderr
    assert "gpu-7 (group lab) can join the bus" in ok.stdout

    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVBENCH_")}
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        running = subprocess.Popen(
            [*AGENT, "--config", str(config), "--node-id", "gpu-7", "--simulated", "--state-dir", str(tmp_path / "a")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean,
        )
    try:
        beat = asyncio.run(_heartbeat(url, token_file.read_text().strip(), "gpu-7"))
        assert beat.inventory.node_id == "gpu-7"
        assert beat.inventory.group == "lab"
        assert "s3cret" not in log.read_text()  # nor logged
        assert asyncio.run(_refused_without_token(url))
    finally:
        running.terminate()
        running.wait(timeout=30)


async def _heartbeat(url: str, token: str, node_id: str) -> Heartbeat:
    async with Bus.connect(url, name="test-watcher", auth=NatsAuth(token=token)) as bus:
        kv = await bus.kv("kvbench_nodes")
        deadline = time.monotonic() + 30
        while True:
            try:
                entry = await kv.get(node_id)
                assert entry.value is not None
                return Heartbeat.model_validate_json(entry.value)
            except nats.js.errors.KeyNotFoundError:
                assert time.monotonic() < deadline, "no heartbeat within 30 s"
                await asyncio.sleep(0.5)


async def _refused_without_token(url: str) -> bool:
    try:
        client = await nats.connect(url, connect_timeout=3, allow_reconnect=False, max_reconnect_attempts=0)
    except Exception as exc:
        return "authorization" in str(exc).lower()
    await client.close()
    return False
