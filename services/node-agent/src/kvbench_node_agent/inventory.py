"""What this machine has. A simulated machine declares a neutral inventory; the plan's `sim` section
gives its GPUs when a stack starts."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

from kvbench_contracts.events import NodeInventory

__all__ = ["collect_inventory"]


def _ram_gb() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 0.0


def _nvidia_gpus() -> tuple[str | None, int, float]:
    if not shutil.which("nvidia-smi"):
        return None, 0, 0.0
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None, 0, 0.0
    rows = [r.split(",") for r in out.strip().splitlines() if r.strip()]
    if not rows:
        return None, 0, 0.0
    return rows[0][0].strip(), len(rows), float(rows[0][1]) / 1024


def rdma_ports(root: str = "/sys/class/infiniband") -> list[dict[str, str]]:
    """RDMA devices and their port state from sysfs (``4: ACTIVE`` -> ``ACTIVE``)."""
    ports: list[dict[str, str]] = []
    if not os.path.isdir(root):
        return ports
    for device in sorted(os.listdir(root)):
        port_dir = os.path.join(root, device, "ports")
        for port in sorted(os.listdir(port_dir)) if os.path.isdir(port_dir) else []:
            try:
                with open(os.path.join(port_dir, port, "state")) as fh:
                    state = fh.read().strip().split(":")[-1].strip()
            except OSError:
                state = "UNKNOWN"
            ports.append({"device": device if port == "1" else f"{device}/{port}", "state": state})
    return ports


ENGINE_BINARIES = (
    "vllm",
    "trtllm-serve",
    "lmcache",
    "mooncake_master",
    "valkey-server",
    "redis-server",
    "vllm-router",
    "docker",
    "nvidia-smi",
    "amd-smi",
)


def collect_inventory(node_id: str, simulated: bool, group: str | None, address: str | None = None) -> NodeInventory:
    if simulated:
        return NodeInventory(
            node_id=node_id,
            hostname=socket.gethostname(),
            simulated=True,
            vendor=None,
            gpu_model=None,
            gpus=0,
            gpu_memory_gb=0,
            ram_gb=_ram_gb(),
            cpus=os.cpu_count() or 0,
            group=group,
            address=address or socket.gethostname(),
        )
    model, count, mem = _nvidia_gpus()
    return NodeInventory(
        node_id=node_id,
        hostname=socket.gethostname(),
        simulated=False,
        vendor="nvidia" if count else None,
        gpu_model=model,
        gpus=count,
        gpu_memory_gb=mem,
        ram_gb=_ram_gb(),
        cpus=os.cpu_count() or 0,
        group=group,
        address=address or socket.gethostname(),
        rdma=rdma_ports(),
        binaries=[b for b in ENGINE_BINARIES if shutil.which(b)],
    )
