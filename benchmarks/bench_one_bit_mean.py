"""Speed of 1BitMean with α-point rounding, memoization and output perturbation.

Client: single-record ``privatize`` with the OS CSPRNG (about 50,000 calls), the batch
path ``privatize_many`` and the vectorised ``setup_many``. Server: wire decode and
aggregate throughput (records/s; target >= 2e6) and estimate time. Settings: the
deployment of 000 §6 (ε = 1, γ = 0.2, 6-hour counters, s = m) and the 24-hour counters
of 000 §5 with ``s = m/20``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.harness import rate, seconds
from protocol.one_bit_mean import OneBitMean
from protocol.randomness import SeededRandom, SystemRandom
from protocol.server.one_bit_mean import OneBitMeanBatch, OneBitMeanServer, OneBitMeanStates

CONFIGS = [
    OneBitMean(epsilon=1.0, m=21_600, gamma=0.2),
    OneBitMean(epsilon=1.0, m=86_400, s=4_320, gamma=0.2),
]


def _bench_one(mech: OneBitMean, n: int) -> dict[str, Any]:
    csprng = SystemRandom()
    server = OneBitMeanServer(mech)
    values = (SeededRandom(1).words(n) % np.uint64(mech.m + 1)).astype(np.int64)

    states: list[OneBitMeanStates] = []
    t_setup = seconds(lambda: states.append(server.setup_many(n, csprng)))

    singles = min(n, 50_000)
    device = states[0].state(0)
    single_values = [int(v) for v in values[:singles]]

    def run_singles() -> None:
        for x in single_values:
            mech.privatize(x, device, csprng)

    t_single = seconds(run_singles)

    batches: list[OneBitMeanBatch] = []
    t_batch = seconds(lambda: batches.append(server.privatize_many(values, states[0], csprng)))
    wire = batches[0].bits.tolist()
    t_decode = seconds(lambda: server.decode_records(wire))
    agg = server.new_aggregate()
    t_add = seconds(lambda: agg.add(batches[0]))
    t_est = seconds(agg.estimate, repeat=3)
    return {
        "mechanism": mech.name,
        "params": {"epsilon": mech.epsilon, "m": mech.m, "s": mech.s, "gamma": mech.gamma},
        "n": n,
        "setup_many_per_s": rate(n, t_setup),
        "privatize_per_s": rate(singles, t_single),
        "privatize_batch_per_s": rate(n, t_batch),
        "decode_per_s": rate(n, t_decode),
        "aggregate_per_s": rate(n, t_add),
        "estimate_s": round(t_est, 6),
    }


def bench(n: int, *, small: bool = False) -> list[dict[str, Any]]:
    """One result row per configuration.

    ``small`` changes nothing: the mechanism's state and aggregate are small at any ``n``.
    """
    return [_bench_one(mech, n) for mech in CONFIGS]
