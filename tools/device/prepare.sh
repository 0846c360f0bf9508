#!/usr/bin/env bash
# Wheels that kvbench's load generator and CLI need on the lent GPU machine (Python 3.12, no package registry
# there; aiohttp, uvloop and numpy are on its image), at the versions uv.lock pins, into .device/wheels (ignored).
set -euo pipefail
cd "$(dirname "$0")/../.."
pins=()
for name in pydantic pydantic-core annotated-types typing-inspection typing-extensions orjson pyyaml python-ulid \
  rich markdown-it-py mdurl pygments pydantic-settings python-dotenv \
  nats-py httpx httpcore h11 anyio certifi click pynacl cffi pycparser cryptography; do
  version=$(grep -A1 "^name = \"$name\"$" uv.lock | sed -n 's/^version = "\(.*\)"/\1/p' | head -1) ||
    { echo "prepare.sh: $name is not in uv.lock" >&2; exit 1; }
  pins+=("$name==$version")
done
mkdir -p .device/wheels
.venv/bin/python -m pip --version >/dev/null 2>&1 || .uv-bootstrap/bin/uv pip install --python .venv/bin/python pip
.venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --implementation cp --dest .device/wheels "${pins[@]}"
ls -la .device/wheels
