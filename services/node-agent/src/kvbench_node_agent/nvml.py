"""NVIDIA GPUs read through NVML (NVIDIA's own library, through the ``nvidia-ml-py`` bindings) rather than by parsing
``nvidia-smi``: the same figures, typed and without a process per read. ``nvidia-smi`` remains the fallback where the
bindings or the driver's library are missing."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["NvmlGpu", "gpus", "samples"]

_lock = threading.Lock()  # nvmlInit/nvmlShutdown are reference counted, but calls from threads are kept in order
_MIB = 1024 * 1024


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str
    memory_total_mib: float


@contextlib.contextmanager
def _session() -> Iterator[Any]:
    """The bindings, initialised; raises RuntimeError where NVML cannot be used here."""
    try:
        import pynvml  # type: ignore[import-untyped]  # noqa: PLC0415 (only on machines with NVIDIA GPUs)
    except ImportError as exc:
        raise RuntimeError("nvidia-ml-py is not installed") from exc
    with _lock:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:  # no driver library, no GPU
            raise RuntimeError(f"NVML: {exc}") from exc
        try:
            yield pynvml
        finally:
            pynvml.nvmlShutdown()


def gpus() -> list[NvmlGpu] | None:
    """Every GPU's name and memory; None where NVML cannot be read (the caller falls back to nvidia-smi)."""
    try:
        with _session() as nvml:
            out = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = nvml.nvmlDeviceGetName(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                out.append(NvmlGpu(index, name.decode() if isinstance(name, bytes) else str(name), memory.total / _MIB))
            return out
    except (RuntimeError, Exception):
        return None


def samples() -> list[dict[str, float]] | None:
    """Power (W), utilisation (%) and memory used (MiB) per GPU; None where NVML cannot be read."""
    try:
        with _session() as nvml:
            out = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                out.append(
                    {
                        "gpu": float(index),
                        "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # NVML reports milliwatts
                        "utilization_pct": float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                        "memory_used_mib": nvml.nvmlDeviceGetMemoryInfo(handle).used / _MIB,
                    }
                )
            return out
    except (RuntimeError, Exception):
        return None
