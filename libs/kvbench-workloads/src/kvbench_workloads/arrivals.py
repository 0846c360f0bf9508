"""When requests arrive in an open loop: inter-arrival gaps for a rate (the load timer, apart from sending)."""

from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = ["arrival_gaps"]


def arrival_gaps(rate: float, distribution: str, burstiness: float, rng: random.Random) -> Iterator[float]:
    """Inter-arrival gaps of mean 1/rate: exponential (Poisson), or gamma with shape ``burstiness``."""
    while True:
        if distribution == "gamma":
            yield rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        else:
            yield rng.expovariate(rate)
