"""kvbench core: the shared runtime every service imports (never runs on its own)."""
