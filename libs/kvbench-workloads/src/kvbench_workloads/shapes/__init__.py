"""Every traffic shape; importing this package registers each one's builder (``source.shape_builder``)."""

from kvbench_workloads.shapes import agentic, documents, synthetic, traces

__all__ = ["agentic", "documents", "synthetic", "traces"]
