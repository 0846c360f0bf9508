#!/usr/bin/env bash
# On the lent GPU machine (16 CPU cores, Python 3.12, no package registry): run one of benchmarks/ with the
# project's sources on PYTHONPATH and the wheels of tools/device/prepare.sh (carried as .device) unpacked beside.
#   bash tools/device/bench.sh bench_workers.py                      # --workers scaling table
#   KVBENCH_BENCH_RATES=1000,2000,3000,4000 bash tools/device/bench.sh bench_loadgen.py driver_benchmarks
set -euo pipefail
site=/tmp/kvbench-site
mkdir -p "$site"
for wheel in .device/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$site" >/dev/null; done
src=$(ls -d "$PWD"/libs/*/src "$PWD"/services/*/src "$PWD"/apps/*/src | tr '\n' ':')
export PYTHONPATH="$site:$src$PWD/benchmarks" KVBENCH_BENCH_WORKER_COUNTS="${KVBENCH_BENCH_WORKER_COUNTS:-1,2,4,8}"
echo "python $(python3 --version 2>&1 | cut -d' ' -f2), $(nproc) cores"
cd benchmarks
if [ $# -ge 2 ]; then
  python3 -c "import ${1%.py} as b; b.$2()"
else
  python3 "$1"
fi
