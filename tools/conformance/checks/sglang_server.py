"""Run inside an SGLang environment: every `python3 -m sglang.launch_server` command through SGLang's own
`prepare_server_args` (its parser, then ServerArgs and the resolution its __post_init__ runs), on the CPU device.

Usage: python sglang_server.py CASES.json RESULTS.json
(cases: [{"id", "argv", "rdma_devices"}], the model a local directory, the devices those the pool declares)
"""

from __future__ import annotations

import os
from typing import Any

from harness import keys_read, run_cases

IB_SYSFS = "/sys/class/infiniband"


def present_host_devices(devices: list[str]) -> None:
    """SGLang checks --disaggregation-ib-device against the RDMA devices in the host's sysfs. This machine is not the
    pool's host: it is shown the devices the pool declares (network.rdma_device), and SGLang's own check still
    decides whether the rendered flag names them correctly. Nothing else in sysfs is touched."""
    real_isdir, real_listdir = os.path.isdir, os.listdir

    def isdir(path: object) -> bool:
        return True if path == IB_SYSFS else real_isdir(path)  # type: ignore[arg-type]

    def listdir(path: object = ".") -> list[str]:
        return list(devices) if path == IB_SYSFS else real_listdir(path)  # type: ignore[arg-type]

    os.path.isdir, os.listdir = isdir, listdir  # type: ignore[assignment]


def check_mooncake_extra_config(args: Any) -> dict[str, object] | None:
    """The Mooncake store's settings a HiCache engine is given (--hicache-storage-backend-extra-config) through
    SGLang's own MooncakeStoreConfig.load_from_extra_config; it reads keys with .get, so a key it never reads is
    ignored silently: those are read off its source, and any other key is a mismatch. None: no Mooncake tier."""
    import json

    if getattr(args, "hicache_storage_backend", None) != "mooncake":
        return None
    raw = getattr(args, "hicache_storage_backend_extra_config", None)
    extra = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStoreConfig

    # the whole class: a key may be read by a helper of the loader (0.5.23 reads local_hostname in one)
    read = keys_read(MooncakeStoreConfig)
    config = MooncakeStoreConfig.load_from_extra_config(extra)
    ignored = sorted(set(extra) - read)
    if ignored:
        return {"ok": False, "error": f"Mooncake keys SGLang never reads (ignored): {ignored}; it reads {sorted(read)}"}
    return {"ok": True, "resolved": {"mooncake": repr(config)[:400]}}


def check(case: dict[str, Any]) -> dict[str, object]:
    from sglang.srt.server_args import prepare_server_args

    argv = case["argv"] if "--device" in case["argv"] else [*case["argv"], "--device", "cpu"]
    args = prepare_server_args(argv)
    resolve = getattr(args, "resolve_once", None)  # from 0.5.2x the launcher resolves, not __post_init__
    if resolve is not None:
        resolve()
    check_args = getattr(args, "check_server_args", None)
    if check_args is not None:
        check_args()
    mooncake = check_mooncake_extra_config(args)
    if mooncake is not None:
        return mooncake
    keep = (
        "disaggregation_mode",
        "enable_hierarchical_cache",
        "disable_radix_cache",
        "hicache_storage_backend",
        "page_size",
        "hicache_size",
        "hicache_write_policy",
    )
    return {"ok": True, "resolved": {k: repr(getattr(args, k, None)) for k in keep}}


if __name__ == "__main__":
    run_cases(check, prepare=lambda cases: present_host_devices(sorted({d for c in cases for d in c["rdma_devices"]})))
