"""Run inside a Mooncake environment (stdlib only): every rendered `mooncake_master` command started for real, the
binary the mooncake-transfer-engine wheel ships (its flags are gflags: an unknown or mistyped one stops it at once,
"ERROR: unknown command line flag"). Its RPC and metrics ports are moved to free ones on loopback; the case passes
when the master stays up and answers GET /metrics on the metrics port, and it is stopped then.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from harness import Result, run_cases

_PORT_FLAGS = ("--rpc_port", "--metrics_port", "--port", "--http_metadata_server_port")


def _binary() -> Path:
    """The wheel's master binary, beside its package's modules (found without importing the package, which loads
    its transfer engine)."""
    import importlib.util

    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("no mooncake package in this environment: rebuild it (tools/conformance/install.py)")
    return Path(next(iter(spec.submodule_search_locations))) / "mooncake_master"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check(case: dict[str, object]) -> Result:
    argv = [str(a) for a in case["argv"]]  # type: ignore[union-attr]
    moved: list[str] = []
    metrics_port = None
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in _PORT_FLAGS and "=" in arg:
            port = _free_port()
            metrics_port = port if flag == "--metrics_port" else metrics_port
            moved.append(f"{flag}={port}")
        else:
            moved.append(arg)
    if metrics_port is None:
        return {"ok": False, "error": "the command names no --metrics_port: the agent could not scrape the master"}
    proc = subprocess.Popen([str(_binary()), *moved], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                lines = [line for line in (proc.stderr.read() if proc.stderr else "").splitlines() if line.strip()]
                error = next((line for line in lines if "ERROR" in line or "error" in line), lines[-1] if lines else "")
                return {"ok": False, "error": f"mooncake_master exited {proc.returncode}: {error}"}
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=1) as answer:
                    text = answer.read().decode()
                return {"ok": True, "resolved": {"metrics_lines": len(text.splitlines())}}
            except OSError:
                time.sleep(0.2)
        return {"ok": False, "error": "mooncake_master did not answer /metrics within 20 s"}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _needs(cases: list[dict[str, object]]) -> None:
    linked = subprocess.run(["ldd", str(_binary())], capture_output=True, text=True, check=False).stdout
    absent = [line.split()[0] for line in linked.splitlines() if "not found" in line]
    if absent:  # a clear message instead of one loader error per case
        sys.exit(f"mooncake_master needs {', '.join(sorted(set(absent)))}: apt-get install libibverbs1")


if __name__ == "__main__":
    run_cases(check, _needs)
