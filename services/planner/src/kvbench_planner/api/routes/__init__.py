"""One router per resource; ``kvbench_planner.api.create_app`` includes them all."""
