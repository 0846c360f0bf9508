"""What the `kvbench` CLI may use of the simulator in process (`kvbench sim run`): batch mode over a plan. The
CLI imports nothing else of this service (checked by `make lint`)."""

from kvbench_sim.whatif import SimProgress, run_plan

__all__ = ["SimProgress", "run_plan"]
