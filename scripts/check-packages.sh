#!/usr/bin/env bash
# Each workspace package installed alone (uv sync --package) into its own environment, then every one of its
# modules imported: a dependency a package uses but does not declare shows here, and so does one it should not
# pull in (the node agent on a GPU machine must not install the simulator, the load generator or pyarrow).
set -euo pipefail
cd "$(dirname "$0")/.."
UV="${UV:-uv}"
ROOT="${KVBENCH_PACKAGES_DIR:-.kvbench/package-envs}"
mkdir -p "$ROOT"

check() {  # package module [modules that must be absent...]
  local package="$1" module="$2"; shift 2
  local env="$ROOT/$package"
  UV_PROJECT_ENVIRONMENT="$env" "$UV" sync --locked --no-dev --package "$package" --quiet
  "$env/bin/python" - "$module" "$@" <<'PY'
import importlib, pkgutil, sys
module, absent = sys.argv[1], sys.argv[2:]
package = importlib.import_module(module)
names = [module] + [m.name for m in pkgutil.walk_packages(package.__path__, module + ".") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
present = [a for a in absent if importlib.util.find_spec(a) is not None]
if present:
    sys.exit(f"{module}: installed alone, it also brings {', '.join(present)}")
print(f"{module}: {len(names)} modules import on their own" + (f"; without {', '.join(absent)}" if absent else ""))
PY
}

check kvbench-contracts kvbench_contracts kvbench_core
check kvbench-core kvbench_core
check kvbench-workloads kvbench_workloads kvbench_core
check kvbench-stacks kvbench_stacks kvbench_core
check kvbench-planner kvbench_planner kvbench_sim kvbench_loadgen
check kvbench-node-agent kvbench_node_agent kvbench_sim kvbench_loadgen kvbench_workloads pyarrow pysnmp
check kvbench-loadgen kvbench_loadgen kvbench_sim
check kvbench-reporter kvbench_reporter kvbench_sim kvbench_loadgen
check kvbench-switch-poller kvbench_switch_poller kvbench_sim
check kvbench-sim kvbench_sim kvbench_loadgen
check kvbench-cli kvbench_cli
