"""Launchers start a stack's processes on this machine behind one interface."""

from kvbench_node_agent.launchers.base import Deployment, Launcher, LaunchError
from kvbench_node_agent.launchers.sim import SimLauncher

__all__ = ["Deployment", "LaunchError", "Launcher", "SimLauncher"]
