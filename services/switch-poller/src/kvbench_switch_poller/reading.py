"""What one read of a switch gives, whichever driver read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench_contracts.fabric import CounterSample, LldpNeighbor

__all__ = ["SwitchPoll", "SwitchReadError"]


class SwitchReadError(RuntimeError):
    """The switch could not be read; the message says why (never the credentials)."""


@dataclass
class SwitchPoll:
    switch: str
    sys_name: str
    uptime_ticks: int
    samples: list[CounterSample] = field(default_factory=list)
    lldp_remote: list[LldpNeighbor] = field(default_factory=list)
