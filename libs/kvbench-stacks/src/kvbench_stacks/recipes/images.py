"""The container images the docker launcher runs, tagged the way each project publishes its releases.

Read off each project's own release code (kept here as facts; none of it is copied):
- vLLM (``.buildkite/scripts/annotate-release.sh`` and its successor that publishes the release family): the CUDA
  image is ``vllm/vllm-openai:v<version>`` (the release version with a ``v``; the scripts strip one the tag may
  carry and add it back), the ROCm image ``vllm/vllm-openai-rocm:v<version>``; ``latest`` follows the newest release.
- SGLang (``.github/workflows/release-docker.yml``): ``lmsysorg/sglang:v<version>`` (the multi-architecture manifest
  over ``-cu129-amd64`` and ``-cu129-arm64``). Its AMD images are built per GPU family:
  ``lmsysorg/sglang:v<version>-rocm700-mi30x`` (MI300X, MI325X) and ``-rocm700-mi35x`` (MI350X, MI355X).
- TensorRT-LLM (NGC, its quick-start guide): ``nvcr.io/nvidia/tensorrt-llm/release:<version>`` with no ``v``
  (``1.3.0rc5``).
- LMCache: ``lmcache/vllm-openai:v<LMCache version>`` (its image of vLLM with LMCache; the release tags seen
  published are ``v0.3.7`` to ``v0.5.5``). The LMCache server, proxies and scripts run from it, at the newest LMCache
  the conformance suite checks (``LMCACHE_RELEASE``, held to tools/conformance/envs.toml by a test).
- vllm-router (its ``.buildkite/scripts/publish-release-images.sh`` and ``Dockerfile.router``): its own image,
  ``vllm/vllm-router:v<router version>`` (x86_64 and aarch64, no GPU libraries), the router's Rust binary as
  ``vllm-router`` on the PATH and no entrypoint; vLLM's own P/D guide runs it as ``docker run vllm/vllm-router:...
  vllm-router ...``. vLLM's image is not known to carry it, so the router never runs from vLLM's. It runs at the
  router release the conformance suite checks (``VLLM_ROUTER_RELEASE``, held to tools/conformance/envs.toml by a
  test), whatever the plan's vLLM: the router talks to the engines over HTTP and the connector's side channel.
- The servers beside the engines of another project (the Mooncake master from SGLang's image, the routers) run the
  image of the newest version of that project the catalog was checked on, never a moving ``latest``; Valkey a patch
  release (``VALKEY_IMAGE``), not the major tag ``8`` that moves under a run.

A plan may name its own image (``engine.args.image``); the agent runs it only where its operator allows it.
"""

from __future__ import annotations

from kvbench_stacks.catalog import CATALOG, get_stack
from kvbench_stacks.query import version_tuple

__all__ = [
    "LMCACHE_RELEASE",
    "VALKEY_IMAGE",
    "VLLM_ROUTER_RELEASE",
    "image_version",
    "lmcache_image",
    "newest_checked",
    "sglang_image",
    "trtllm_image",
    "vllm_image",
    "vllm_router_image",
]

# the newest LMCache the conformance suite runs its parsers on (tools/conformance/envs.toml)
LMCACHE_RELEASE = "0.5.6"
VALKEY_IMAGE = "valkey/valkey:8.1.10"
# the vllm-router release the conformance suite runs its parser on (tools/conformance/envs.toml)
VLLM_ROUTER_RELEASE = "0.1.17"

# SGLang's AMD images, by the GPU family they are built for
_SGLANG_AMD_FAMILY = {"MI300X": "mi30x", "MI325X": "mi30x", "MI350X": "mi35x", "MI355X": "mi35x"}


def _release(version: str | None) -> str | None:
    """The release number a tag is built from: ``0.28.0`` for ``0.28.0`` or ``v0.28.0``; None for none."""
    if not version:
        return None
    return version[1:] if version[:1] in ("v", "V") else version


def image_version(stack: str, engine: str, version: str | None) -> str | None:
    """The release an engine image is tagged with: the plan's version, else the newest one the conformance suite
    checked the stack's recipe on (a moving ``latest`` may no longer accept the rendered arguments); None when
    neither is known."""
    if version:
        return version
    spec = get_stack(stack)
    checked = spec.checked_releases(engine) if spec else []
    return max(checked, key=version_tuple) if checked else None


def newest_checked(engine: str) -> str | None:
    """The newest version of ``engine`` any stack of the catalog was checked on: the release a server from that
    project's image runs at where the plan's engine is another (a vLLM stack's Mooncake master from SGLang's)."""
    checked = [release for spec in CATALOG.values() for release in spec.checked_releases(engine)]
    return max(checked, key=version_tuple) if checked else None


def lmcache_image(version: str | None = None) -> str:
    return f"lmcache/vllm-openai:v{_release(version) or LMCACHE_RELEASE}"


def vllm_router_image() -> str:
    """vllm-router's own image (CPU only, for x86_64 and aarch64 hosts alike, so an AMD pool's router too)."""
    return f"vllm/vllm-router:v{VLLM_ROUTER_RELEASE}"


def vllm_image(version: str | None, rocm: bool) -> str:
    release = _release(version)
    tag = f"v{release}" if release else "latest"
    return f"vllm/vllm-openai-rocm:{tag}" if rocm else f"vllm/vllm-openai:{tag}"


def sglang_image(version: str | None, rocm: bool, gpu_model: str | None = None) -> str:
    release = _release(version)
    if not rocm:
        return f"lmsysorg/sglang:v{release}" if release else "lmsysorg/sglang:latest"
    family = _SGLANG_AMD_FAMILY.get((gpu_model or "").upper(), "mi30x")
    # SGLang tags its AMD images per release only; every SGLang stack has a checked release (image_version)
    return f"lmsysorg/sglang:v{release}-rocm700-{family}" if release else "lmsysorg/sglang:latest"


def trtllm_image(version: str | None) -> str:
    release = _release(version)
    return f"nvcr.io/nvidia/tensorrt-llm/release:{release or 'latest'}"
