"""What the `kvbench` CLI may use of the planner without a server (`kvbench plan validate`, `kvbench sim run`):
the plan review. The CLI imports nothing else of this service (checked by `make lint`)."""

from kvbench_planner.validation import GroupResolver, load_cluster_file, review_text

__all__ = ["GroupResolver", "load_cluster_file", "review_text"]
