"""LMCache's P/D proxies onto this machine: ``kvbench-agent --fetch-lmcache-examples [DIR]``.

The LMCache stacks with a prefill/decode split run LMCache's own proxy (``examples/disagg_prefill*/
disagg_proxy_server.py`` of its repository), and nothing installs it: the ``lmcache`` wheel holds no examples (0.5.6:
no file under ``examples/`` or named ``*proxy*``), and LMCache's published images (``lmcache/vllm-openai:v<version>``)
are built from its Dockerfile's ``image-release`` stage, which installs that wheel from PyPI and copies nothing of the
repository (.github/workflows/publish.yml, docker/Dockerfile). So the examples are fetched here, at the same release
as the image the stacks run, into a host directory the docker launcher mounts read-only; the download is the release
tag's source archive from GitHub (``archive/refs/tags/v<version>.tar.gz``), of which only ``examples/`` is kept.
"""

from __future__ import annotations

import io
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from kvbench_stacks.recipes.images import LMCACHE_RELEASE

__all__ = ["DEFAULT_DIR", "archive_url", "extract_examples", "fetch"]

DEFAULT_DIR = Path("/opt/lmcache/examples")  # the recipes' default (engine.args.lmcache_examples overrides it)


def archive_url(version: str = LMCACHE_RELEASE) -> str:
    return f"https://github.com/LMCache/LMCache/archive/refs/tags/v{version}.tar.gz"


def extract_examples(archive: bytes, dest: Path) -> int:
    """The ``examples/`` tree of a GitHub source archive (one top folder, ``LMCache-<version>/``) into ``dest``,
    replacing what was there; returns how many files. Refuses an archive without it, or with a member that would
    land outside ``dest`` (tarfile's ``data`` filter)."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        members = []
        for member in tar.getmembers():
            parts = PurePosixPath(member.name).parts
            if len(parts) > 2 and parts[1] == "examples" and (member.isfile() or member.isdir()):
                member.name = str(PurePosixPath(*parts[2:]))
                members.append(member)
        if not any(m.isfile() for m in members):
            raise ValueError("the archive has no examples/ folder: is it LMCache's source archive?")
        dest.parent.mkdir(parents=True, exist_ok=True)
        # extracted beside dest first, so a failed download or a bad member leaves the previous examples as they were
        staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
        try:
            tar.extractall(staging, members=members, filter="data")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if dest.exists():
            shutil.rmtree(dest)
        staging.chmod(0o755)  # mkdtemp makes it 0700; the engines' containers may run as another user
        staging.rename(dest)
    return sum(1 for m in members if m.isfile())


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 (a fixed https URL)
        data: bytes = response.read()
        return data


def fetch(
    dest: Path = DEFAULT_DIR, version: str = LMCACHE_RELEASE, download: Callable[[str], bytes] | None = None
) -> str:
    """Download LMCache ``version``'s examples into ``dest``; returns what was done, for a person to read."""
    url = archive_url(version)
    sys.stderr.write(f"kvbench-agent: downloading {url}\n")
    count = extract_examples((download or _download)(url), dest)
    return f"LMCache {version} examples: {count} files in {dest} (the P/D proxies the LMCache stacks run)"
