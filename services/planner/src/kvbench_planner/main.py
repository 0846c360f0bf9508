from __future__ import annotations

import uvicorn

from kvbench_core.logging import configure_logging
from kvbench_core.settings import load_settings
from kvbench_planner.api import create_app
from kvbench_planner.settings import PlannerSettings

__all__ = ["main"]


def main() -> None:
    settings = load_settings(PlannerSettings)
    configure_logging("planner", settings.log_level, settings.log_json)
    # uvicorn owns the signals here; the app's lifespan drains the bus on shutdown
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_config=None, access_log=False)
