"""What this machine has. A simulated machine declares a neutral inventory; the plan's `sim` section
gives its GPUs when a stack starts."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import Any

from kvbench_contracts.events import MachinePolicy, NodeInventory
from kvbench_contracts.fabric import LldpNeighbor
from kvbench_node_agent import nvml
from kvbench_node_agent.fabric import lldp_neighbors, nic_fec, rdma_port_details, read_text
from kvbench_stacks.hardware import gpu_spec

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


def _nvidia_smi(fields: str) -> list[list[str]]:
    """Rows of ``nvidia-smi --query-gpu=FIELDS`` (stripped cells); empty when it is absent or fails."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [[cell.strip() for cell in row.split(",")] for row in out.strip().splitlines() if row.strip()]


def _nvidia_gpus() -> tuple[str | None, int, float]:
    """The first GPU's name, the count and the memory per GPU (GiB): NVML, else nvidia-smi."""
    found = nvml.gpus()
    if found:
        return found[0].name, len(found), found[0].memory_total_mib / 1024
    rows = _nvidia_smi("name,memory.total")
    if not rows:
        return None, 0, 0.0
    return rows[0][0], len(rows), float(rows[0][1]) / 1024


def rdma_ports(root: str = "/sys/class/infiniband") -> list[dict[str, str]]:
    """RDMA ports from sysfs: state (``4: ACTIVE`` -> ``ACTIVE``), physical state, rate, link layer and the netdev
    it rides on (what ties an RDMA card to its LLDP neighbour); port 1 is named by its device alone."""
    ports = []
    for port in rdma_port_details(root):
        device, _, number = port["device"].partition("/")
        ports.append({**port, "device": device if number == "1" else port["device"]})
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


_REAL_FS = (
    "ext4",
    "xfs",
    "btrfs",
    "zfs",
    "nfs",
    "nfs4",
    "lustre",
    "wekafs",
    "cephfs",
    "beegfs",
    "gpfs",
    "fuse.juicefs",
)


def disks() -> list[dict[str, Any]]:
    """Mounted filesystems that can hold a disk tier or a shared file tier, with their size and free space."""
    out: list[dict[str, Any]] = []
    try:
        with open("/proc/mounts") as fh:
            mounts = [line.split()[:3] for line in fh]
    except OSError:
        return out
    for _device, mount, fstype in mounts:
        if fstype not in _REAL_FS:
            continue
        try:
            usage = shutil.disk_usage(mount)
        except OSError:
            continue
        out.append(
            {
                "mount": mount,
                "fstype": fstype,
                "total_gb": round(usage.total / 1e9, 1),
                "free_gb": round(usage.free / 1e9, 1),
                "writable": os.access(mount, os.W_OK),
                "shared": fstype.startswith(("nfs", "lustre", "weka", "ceph", "beegfs", "gpfs", "fuse")),
            }
        )
    return out


def nics(root: str = "/sys/class/net") -> list[dict[str, Any]]:
    """Network cards: name, MAC, speed (Mb/s), MTU and state (the fabric work adds LLDP and counters)."""
    out: list[dict[str, Any]] = []
    if not os.path.isdir(root):
        return out
    for name in sorted(os.listdir(root)):
        if name == "lo":
            continue

        def read(attr: str, nic: str = name) -> str:
            return read_text(os.path.join(root, nic, attr))

        speed = read("speed")
        out.append(
            {
                "name": name,
                "mac": read("address"),
                "mtu": int(read("mtu") or 0),
                "speed_mbps": int(speed) if speed.lstrip("-").isdigit() and int(speed) > 0 else None,
                "state": read("operstate"),
                "fec": nic_fec(name),  # active FEC class (off, baser, rs) where the driver reports it
            }
        )
    return out


def gpu_samples() -> list[dict[str, float]]:
    """Power (W), utilization (%) and memory used per GPU: NVML, else nvidia-smi, when either is present."""
    read = nvml.samples()
    if read is not None:
        return read
    samples = []
    for parts in _nvidia_smi("index,power.draw,utilization.gpu,memory.used"):
        try:
            samples.append(
                {
                    "gpu": float(parts[0]),
                    "power_w": float(parts[1]),
                    "utilization_pct": float(parts[2]),
                    "memory_used_mib": float(parts[3]),
                }
            )
        except (ValueError, IndexError):
            continue
    return samples


def _simulated_cable(node_id: str, switch: str | None) -> list[dict[str, Any]]:
    """A simulated machine ``sim-<i>`` is cabled from its eth0 to port swp<i+1> of the simulated leaf."""
    index = node_id.rsplit("-", 1)[-1]
    if switch is None or not index.isdigit():
        return []
    cable = LldpNeighbor(
        local_port="eth0", chassis_id=switch, chassis_id_subtype="local", system_name=switch,
        port_id=f"swp{int(index) + 1}", port_id_subtype="ifname",
    )  # fmt: skip
    return [cable.model_dump()]


def collect_inventory(
    node_id: str,
    simulated: bool,
    group: str | None,
    address: str | None = None,
    sim_switch: str | None = None,
    sim_gpus: tuple[str, int] | None = None,
    policy: MachinePolicy | None = None,
) -> NodeInventory:
    """``sim_gpus``: a simulated host of a group declares these GPUs (model, count), as a real one would;
    ``policy``: what a plan may run or write on this (real) machine, for the planner's review."""
    if simulated:
        spec = gpu_spec(sim_gpus[0]) if sim_gpus else None
        return NodeInventory(
            node_id=node_id,
            hostname=socket.gethostname(),
            simulated=True,
            vendor=spec.vendor if spec else None,
            gpu_model=spec.name if spec else None,
            gpus=sim_gpus[1] if spec and sim_gpus else 0,
            gpu_memory_gb=spec.mem_gb if spec else 0,
            ram_gb=_ram_gb(),
            cpus=os.cpu_count() or 0,
            group=group,
            address=address or socket.gethostname(),
            lldp=_simulated_cable(node_id, sim_switch),
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
        disks=disks(),
        nics=nics(),
        lldp=[n.model_dump() for n in lldp_neighbors()],
        policy=policy,
    )
