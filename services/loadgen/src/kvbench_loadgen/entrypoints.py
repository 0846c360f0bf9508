"""What the `kvbench` CLI may use of the load generator (`kvbench load`): the driver and its router. The CLI
imports nothing else of this service (checked by `make lint`)."""

from kvbench_loadgen.driver import DriveConfig, Driver
from kvbench_loadgen.lag import LagProbe, client_timing
from kvbench_loadgen.routing import Router

__all__ = ["DriveConfig", "Driver", "LagProbe", "Router", "client_timing"]
