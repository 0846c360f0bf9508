#!/usr/bin/env bash
# On the lent H200 machine: kvbench's own stacks against a real vLLM 0.25.1 (docs/live.md).
# Needs, carried along: .gpu (../shared/tools/gpu-vllm/prepare.sh: the trimmed vLLM wheel, its dependencies, the
# stand-in model) and .device (tools/device/prepare.sh: kvbench's own dependencies). Results go to $OUT.
#   bash tools/live/live.sh unpack           # first call: vLLM's site and the model (the 64 MiB a call allows)
#   bash tools/live/live.sh run [SUITE [RUNS]]  # later calls: vLLM's compiled core, then a suite of live runs
set -euo pipefail
OUT=${OUT:-$PWD/live-out}; mkdir -p "$OUT"
export PYTHONPATH="/tmp/site:/tmp/kvbench-site:$(ls -d "$PWD"/libs/*/src "$PWD"/services/*/src "$PWD"/apps/*/src | tr '\n' ':')"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# VLLM_SERVER_DEV_MODE: vLLM serves POST /reset_prefix_cache only with it (the runs empty the cache between loads)
export TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_SERVER_DEV_MODE=1 OUT
# kvbench sizes its prompts with the served model's own tokenizer (the stand-in beside the model), not the words fallback
export KVBENCH_TOKENIZER_PATH=/tmp/model/tokenizer.json
case "${1:-run}" in
  unpack)
    mkdir -p /tmp/site /tmp/kvbench-site /tmp/model
    tar -C /tmp/site -xJf .gpu/a/site.tar.xz
    for wheel in .device/wheels/*.whl; do python3 -m zipfile -e "$wheel" /tmp/kvbench-site >/dev/null; done
    if [ -d .gpu/lm ]; then  # LMCache 0.5.1 and its wheels (../shared/tools/gpu-vllm/lmcache/prepare-lmcache.sh)
      rm -rf /tmp/site/opentelemetry* /tmp/site/importlib_metadata*  # LMCache's versions replace vLLM site's
      for wheel in .gpu/lm/*.whl; do python3 -m zipfile -e "$wheel" /tmp/site >/dev/null; done
    fi
    cp -r .gpu/model/. /tmp/model/
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])" | tee -a "$OUT/gpu.txt"
    ;;
  run)
    if [ ! -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ]; then
      python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.gpu/b/C.so.xz'), open('/tmp/site/vllm/_C_stable_libtorch.abi3.so', 'wb'))"
    fi
    # the wheel was unzipped, not installed: no `vllm` console script, so the recipe's `vllm serve` gets one
    mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' > /tmp/bin/vllm
    printf '#!/bin/sh\nexec python3 -c "import sys; sys.argv[0] = \\"lmcache\\"; from lmcache.cli.main import main; main()" "$@"\n' > /tmp/bin/lmcache
    chmod +x /tmp/bin/vllm /tmp/bin/lmcache && export PATH="/tmp/bin:$PATH" LMCACHE_DISABLE_BANNER=1
    # the suite (stacks, calibration, study) and, optionally, some of its runs; files in a work folder, and all
    # of them in one archive under $OUT after every run (the machine returns at most 8 files a call)
    suite=${2:-stacks}
    work=/tmp/live-work/$suite && mkdir -p "$work"
    dest=$OUT
    OUT=$work LIVE_ARCHIVE="$dest/live-$suite.tar.gz" python3 tools/live/run.py --suite "$suite" ${3:+--runs "$3"} \
      2>&1 | tee "$dest/run-$suite.txt"
    ;;
esac
