"""Speed of binary randomized response: client privatize, server aggregate, estimate."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.harness import rate, seconds
from protocol.randomized_response import RandomizedResponse
from protocol.randomness import SeededRandom, SystemRandom
from protocol.server.randomized_response import RRServer


def bench(n: int, *, small: bool = False) -> list[dict[str, Any]]:
    """One result row per configuration.

    ``small`` changes nothing: the mechanism's state and aggregate are small at any ``n``.
    """
    mech = RandomizedResponse(epsilon=1.0)
    server = RRServer(mech)
    csprng = SystemRandom()
    values = (SeededRandom(1).words(n) & np.uint64(1)).astype(np.uint8)
    singles = min(n, 50_000)
    t_single = seconds(lambda: [mech.privatize(1, None, csprng) for _ in range(singles)])
    batch_holder: list[Any] = []
    t_batch = seconds(lambda: batch_holder.append(server.privatize_many(values, csprng)))
    batch = batch_holder[0]
    agg = server.new_aggregate()
    t_add = seconds(lambda: agg.add(batch))
    t_est = seconds(agg.estimate, repeat=3)
    return [
        {
            "mechanism": "rr",
            "params": {"epsilon": 1.0},
            "n": n,
            "privatize_per_s": rate(singles, t_single),
            "privatize_batch_per_s": rate(n, t_batch),
            "aggregate_per_s": rate(n, t_add),
            "estimate_s": round(t_est, 6),
        }
    ]
