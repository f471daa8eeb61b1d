"""Speed of RAPPOR at the 004 §5.4 (Chrome) parameters: client privatize, server aggregate, estimate.

k = 128, h = 2, 32 cohorts, f = 0.75, p = 0.5, q = 0.75 (ε1 = 0.5343, ε∞ = 2.0433).

* ``privatize_per_s``: single ``privatize`` calls with the OS CSPRNG by one device whose
  value varies over a pool of 100 strings (memo hits after the first round: one IRR).
* ``privatize_new_value_per_s``: ``setup`` + ``privatize`` of a value the device has not
  seen (draws B' and the IRR, grows the memo).
* ``privatize_batch_per_s``: ``privatize_many`` (fresh devices, PRR and IRR) with the CSPRNG.
* ``aggregate_per_s``: ``add`` of one batch of ``n`` records (target >= 10^6 records/s).
* ``decode_per_s``: strict wire decoding of 10^5 records.
* ``estimate_s``: per-cohort ``t_ij`` with standard errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.harness import rate, seconds
from protocol.randomness import SeededRandom, SystemRandom, uniform_ints
from protocol.rappor import Rappor
from protocol.server.rappor import RapporBatch, RapporServer

PARAMS: dict[str, Any] = {"k": 128, "h": 2, "cohorts": 32, "f": 0.75, "p": 0.5, "q": 0.75}


def bench(n: int, *, small: bool = False) -> list[dict[str, Any]]:
    """One result row for the Chrome configuration.

    ``small`` changes nothing: the mechanism's state and aggregate are small at any ``n``.
    """
    mech = Rappor(seed=b"benchmark-rappor-seed", **PARAMS)
    server = RapporServer(mech)
    csprng = SystemRandom()
    pool = [f"homepage-{i}.example" for i in range(100)]

    singles = min(n, 50_000)
    state = mech.setup(csprng)

    def run_singles() -> None:
        nonlocal state
        for i in range(singles):
            _, state = mech.privatize(pool[i % 100], state, csprng)

    t_single = seconds(run_singles)

    fresh = min(n, 10_000)
    t_new = seconds(lambda: [mech.privatize(pool[i % 100], mech.setup(csprng), csprng) for i in range(fresh)])

    # The fleet: values from an exponential-like popularity over the pool, uniform cohorts.
    choice = SeededRandom(2).words(n) % np.uint64(100)
    values = [pool[int(i)] for i in np.minimum(choice, choice[::-1])]
    cohorts = uniform_ints(SeededRandom(3), mech.cohorts, n)
    holder: list[RapporBatch] = []
    t_batch = seconds(lambda: holder.append(server.privatize_many(values, cohorts, csprng)))
    batch = holder[0]

    agg = server.new_aggregate()
    t_add = seconds(lambda: agg.add(batch))
    best_add = seconds(lambda: server.new_aggregate().add(batch), repeat=3)

    records = min(n, 100_000)
    wire = [[int(c), bytes(b)] for c, b in zip(batch.cohorts[:records], batch.bits[:records], strict=True)]
    t_decode = seconds(lambda: server.decode_records(wire))
    t_est = seconds(agg.estimate_bits, repeat=3)
    return [
        {
            "mechanism": "rappor",
            "params": {**PARAMS, "variant": "standard"},
            "epsilon_one": round(mech.epsilon_one, 4),
            "epsilon_infinity": round(mech.epsilon_infinity, 4),
            "n": n,
            "privatize_per_s": rate(singles, t_single),
            "privatize_new_value_per_s": rate(fresh, t_new),
            "privatize_batch_per_s": rate(n, t_batch),
            "aggregate_per_s": rate(n, min(t_add, best_add)),
            "decode_per_s": rate(records, t_decode),
            "estimate_s": round(t_est, 6),
        }
    ]
