"""The simulated form of a stack's processes: kvbench's simulated engine, store and router as ordinary process specs,
each reading one spec file (``kvbench_contracts.sim``) that the spec carries as a config file. The node agent's sim
launcher decides ports and specs (many simulated machines share one host) and starts these like any other process."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from kvbench_stacks.recipes.model import ProcessSpec, Role

__all__ = ["SimVerb", "simulated_process"]

SimVerb = Literal["serve", "store", "route"]


def simulated_process(name: str, verb: SimVerb, role: Role, spec: BaseModel, python: str, host: str,
                      port: int) -> ProcessSpec:  # fmt: skip
    """``python -m kvbench_sim VERB --spec FILE`` with its spec written first; healthy when it answers /health."""
    file = f"sim-{name}.json"
    return ProcessSpec(
        name=f"sim-{name}",
        role=role,
        argv=[python, "-m", "kvbench_sim", verb, "--spec", f"{{run_dir}}/{file}"],
        # engines that share a store hash prompt words alike (Python salts its string hash per process otherwise)
        env={"PYTHONHASHSEED": "0"},
        files={file: spec.model_dump_json(indent=2)},
        ports={"http": port},
        health=("http", port, "/health"),
        metrics=(port, "/metrics") if verb == "serve" else None,
        binary=python,
        serves_requests=role in ("engine", "decode", "router"),
    )
