#!/usr/bin/env bash
# On the lent GPU machine (16 CPU cores): `kvbench load --workers N` scaling, N workers and N mock servers.
# Needs .device/wheels (tools/device/prepare.sh) carried along; prints the benchmark's table.
set -euo pipefail
site=/tmp/kvbench-site
mkdir -p "$site"
for wheel in .device/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$site" >/dev/null; done
src=$(ls -d "$PWD"/libs/*/src "$PWD"/services/*/src "$PWD"/apps/*/src | tr '\n' ':')
export PYTHONPATH="$site:$src" KVBENCH_BENCH_WORKER_COUNTS="${KVBENCH_BENCH_WORKER_COUNTS:-1,2,4,8}"
python3 --version
nproc
cd benchmarks && python3 bench_workers.py
