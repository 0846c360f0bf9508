"""How fast the simulated engine's core runs in batch mode (no sleeping), on one core.

Prints: simulated seconds, wall seconds, speed-up over real time, engine steps/s and requests/s, for a
closed loop of shared-prefix sessions on one simulated L40S engine. Baseline in the same run: the same
load with the prefix cache off (more prefill work per step, fewer hash lookups).
"""

from __future__ import annotations

import random
import time

from kvbench_sim.engine import Engine, SimRequest
from kvbench_sim.profiles import EngineConfig, load_profile


def run(prefix_caching: bool, users: int = 32, requests: int = 3000, seed: int = 0) -> dict[str, float]:
    engine = Engine(load_profile("L40S", "Qwen/Qwen3-8B", EngineConfig(prefix_caching=prefix_caching)), seed=seed)
    rng = random.Random(seed)
    prefixes = [[f"g{g}w{i}" for i in range(2048)] for g in range(8)]
    now, sent, done, steps = 0.0, 0, 0, 0
    in_flight = 0
    start = time.perf_counter()
    while done < requests:
        while in_flight < users and sent < requests:
            prompt = prefixes[sent % 8] + [f"q{sent}-{i}" for i in range(rng.randint(64, 256))]
            engine.add(SimRequest(f"r{sent}", prompt, 64, now))
            sent += 1
            in_flight += 1
        plan = engine.schedule()
        if plan is None:
            break
        now += plan.duration_s
        steps += 1
        for event in engine.complete(plan, now):
            if event.finished:
                done += 1
                in_flight -= 1
    wall = time.perf_counter() - start
    return {
        "simulated_s": now,
        "wall_s": wall,
        "speedup": now / wall,
        "steps_per_s": steps / wall,
        "requests_per_s": done / wall,
        "hit_ratio": engine.counters.prefix_hits / engine.counters.prefix_queries,
    }


def main() -> None:
    for label, caching in (("prefix cache on", True), ("baseline: prefix cache off", False)):
        r = run(caching)
        print(
            f"{label:28s} simulated {r['simulated_s']:8.1f} s in {r['wall_s']:6.2f} s wall "
            f"({r['speedup']:7.1f}x real time) · {r['steps_per_s']:8.0f} steps/s · "
            f"{r['requests_per_s']:7.0f} requests/s · hit ratio {r['hit_ratio']:.2f}"
        )


if __name__ == "__main__":
    main()
