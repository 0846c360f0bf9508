"""SGLang stacks: radix cache, HiCache tiers, prefill/decode split (stacks.md 2)."""

from __future__ import annotations

from collections.abc import Callable

from kvbench_stacks.recipes.common import (
    EngineSlot,
    Machines,
    engine_slots,
    head_first,
    head_last,
    place,
    url_of,
)
from kvbench_stacks.recipes.engines import HICACHE_PAGE_SIZE, hicache_args, sglang
from kvbench_stacks.recipes.images import image_version, sglang_image
from kvbench_stacks.recipes.model import ProcessSpec, RenderContext
from kvbench_stacks.recipes.ports import PORTS
from kvbench_stacks.recipes.registry import recipe
from kvbench_stacks.recipes.servers import (
    mooncake_extra_config,
    mooncake_master,
    router_process,
)


@recipe("sglang-radix-off", on=False)
@recipe("sglang-radix", on=True)
def sglang_radix(ctx: RenderContext, on: bool) -> Machines:  # stacks.md 2.1
    return place(engine_slots(ctx, False), lambda s: sglang(ctx, s, [] if on else ["--disable-radix-cache"]))


@recipe("sglang-hicache-host")
def sglang_hicache_host(ctx: RenderContext) -> Machines:  # stacks.md 2.2
    return place(engine_slots(ctx, False), lambda s: sglang(ctx, s, hicache_args(ctx)))


@recipe("sglang-hicache-file")
def sglang_hicache_file(ctx: RenderContext) -> Machines:  # stacks.md 2.3
    path = str(ctx.sizing.get("shared_mount_path"))
    return place(
        engine_slots(ctx, False),
        lambda s: sglang(
            ctx,
            s,
            [*hicache_args(ctx), "--hicache-storage-backend", "file", "--hicache-storage-prefetch-policy", "timeout"],
            env={"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": path},
        ),
    )


@recipe("sglang-hicache-mooncake")
def sglang_hicache_mooncake(ctx: RenderContext) -> Machines:  # stacks.md 2.4
    out = place(
        engine_slots(ctx, False),
        lambda s: sglang(
            ctx,
            s,
            [
                *hicache_args(ctx),
                "--hicache-storage-backend",
                "mooncake",
                "--hicache-storage-backend-extra-config",
                mooncake_extra_config(ctx, s.machine),
            ],
        ),
    )
    return head_first(out, mooncake_master(ctx))


@recipe("sglang-pd-nixl", backend="nixl")
@recipe("sglang-pd-mooncake", backend="mooncake")
@recipe("sglang-pd-mori", backend="mori")
def sglang_pd(
    ctx: RenderContext,
    backend: str,
    decode_extra: Callable[[EngineSlot], list[str]] | None = None,
    prefill_extra: Callable[[EngineSlot], list[str]] | None = None,
) -> Machines:  # stacks.md 2.5 (the extras: each slot's own arguments, by role)
    slots = engine_slots(ctx, True)
    device = ctx.network.get("rdma_device")

    def build(s: EngineSlot) -> ProcessSpec:
        extra = ["--disaggregation-mode", s.role, "--disaggregation-transfer-backend", backend]
        if device:
            extra += ["--disaggregation-ib-device", str(device)]
        if s.role == "prefill":
            extra += [
                "--disaggregation-bootstrap-port",
                str(PORTS["pd_bootstrap_base"] + s.index),
                *(prefill_extra(s) if prefill_extra else []),
            ]
        else:
            extra += decode_extra(s) if decode_extra else []
        return sglang(ctx, s, extra)

    argv = [
        "python3",
        "-m",
        "sglang_router.launch_router",
        "--pd-disaggregation",
        "--host",
        "0.0.0.0",
        "--port",
        str(PORTS["router"]),
    ]
    for s in slots:
        if s.role == "prefill":
            argv += ["--prefill", url_of(ctx, s), str(PORTS["pd_bootstrap_base"] + s.index)]
        else:
            argv += ["--decode", url_of(ctx, s)]
    # the router needs no GPU: the release's multi-architecture image runs on any head machine
    release = image_version(ctx.stack, "sglang", ctx.engine.version)
    router = router_process(ctx, argv, "python-module:sglang_router", sglang_image(release, rocm=False))
    return head_last(place(slots, build), router)


@recipe("sglang-pd-decode-offload")
def sglang_pd_offload(ctx: RenderContext) -> Machines:  # stacks.md 2.6
    out = sglang_pd(
        ctx,
        "mooncake",
        decode_extra=lambda s: [
            "--disaggregation-decode-enable-offload-kvcache",
            *hicache_args(ctx, enable=False),
            "--hicache-storage-backend",
            "mooncake",
            "--hicache-storage-backend-extra-config",
            mooncake_extra_config(ctx, s.machine),
        ],
        prefill_extra=lambda s: [
            # the decode servers' page size (hicache_args): SGLang refuses a pair that differ ("Page size mismatch
            # ... Both servers must use the same --page-size value", disaggregation/common/conn.py, 0.5.20)
            "--page-size",
            HICACHE_PAGE_SIZE,
            "--enable-hierarchical-cache",
            "--hicache-storage-backend",
            "mooncake",
            "--hicache-storage-backend-extra-config",
            mooncake_extra_config(ctx, s.machine),
        ],
    )
    return head_first(out, mooncake_master(ctx))
