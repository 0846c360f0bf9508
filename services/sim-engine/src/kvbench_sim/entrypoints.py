"""What the `kvbench` CLI may use of the simulator in process (`kvbench sim run`, `kvbench sim search`): batch mode
over a plan, and a plan's question answered. The CLI imports nothing else of this service (checked by `make lint`)."""

from kvbench_sim.search import search_plan
from kvbench_sim.whatif import SimProgress, run_plan

__all__ = ["SimProgress", "run_plan", "search_plan"]
