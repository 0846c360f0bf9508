"""Where this machine holds a plan's model, found before anything starts.

In order: the plan's own local folder (an absolute path), the operator's model folder
(``KVBENCH_NODE_AGENT_MODELS_DIR``, holding ``<org>/<name>`` folders as ``huggingface-cli download --local-dir``
leaves them), then the Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``), where the engine finds the model
by its id itself. A folder must hold the model's ``config.json`` and a tokenizer, and its weights unless the plan
loads random ones (``engine.args.load_format: dummy``, a rehearsal: the engine then needs only the config and the
tokenizer). What is not found fails the stack at once, naming the model, the machine and the fix, instead of an
engine that downloads for longer than its health wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench_node_agent.preflight import PreflightIssue, hub_cache

__all__ = ["ModelLocation", "resolve_model"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


@dataclass(frozen=True)
class ModelLocation:
    path: str | None  # a local folder the engine loads (served under the plan's id); None: the engine finds the id
    where: str  # how it was found, for the stack's facts and the report


def _missing(folder: Path, dummy: bool) -> list[str]:
    """What a model folder lacks for an engine to serve it."""
    lacks = []
    if not (folder / "config.json").is_file():
        lacks.append("config.json")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        lacks.append("a tokenizer (tokenizer.json)")
    if not dummy and not any(next(folder.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        lacks.append("weights (*.safetensors)")
    return lacks


def resolve_model(
    machine: str, model: str, engine_args: dict[str, Any], models_dir: str | None
) -> ModelLocation | PreflightIssue:
    dummy = str(engine_args.get("load_format", "")).lower() == "dummy"
    rehearsal = " with random weights (engine.args.load_format: dummy)" if dummy else ""
    candidates: list[tuple[Path, str]] = []
    if model.startswith("/"):
        candidates.append((Path(model), "the plan's local folder"))
    elif models_dir:
        candidates.append((Path(models_dir) / model, "the machine's model folder (KVBENCH_NODE_AGENT_MODELS_DIR)"))
    for folder, where in candidates:
        if folder.is_dir():
            lacks = _missing(folder, dummy)
            if lacks:
                return PreflightIssue(
                    machine,
                    "model",
                    f"{model}{rehearsal}: {folder} lacks {', '.join(lacks)}",
                    f"Put the model's files in {folder} (huggingface-cli download {model} --local-dir {folder}; "
                    "for a rehearsal with random weights, its config.json and tokenizer files are enough)",
                )
            return ModelLocation(str(folder), f"{where}: {folder}")
    if not model.startswith("/"):
        snapshots = hub_cache() / f"models--{model.replace('/', '--')}" / "snapshots"
        for snapshot in sorted(snapshots.glob("*"), reverse=True):
            if snapshot.is_dir() and not _missing(snapshot, dummy):
                return ModelLocation(None, f"the Hugging Face cache: {snapshot}")
    looked = [str(folder) for folder, _ in candidates]
    if not model.startswith("/"):
        looked.append(str(hub_cache() / f"models--{model.replace('/', '--')}"))
    return PreflightIssue(
        machine,
        "model",
        f"{model}{rehearsal} is not on this machine (looked in {', '.join(looked)})",
        f"Download it first on every machine: huggingface-cli download {model} (HF_TOKEN set for a gated model), "
        "or put its folder under the agent's KVBENCH_NODE_AGENT_MODELS_DIR, or give the plan a local folder",
    )
