"""Speed of dBitFlip / dBitFlipPM (k = 32 buckets on 24 h, 000 §5): client, server, estimate."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.harness import rate, seconds
from protocol.buckets import LinearBuckets
from protocol.dbitflip import DBitFlip
from protocol.randomness import SeededRandom, SystemRandom
from protocol.server.dbitflip import DBitFlipServer

DAY = 86_400


def bench(n: int, *, small: bool = False) -> list[dict[str, Any]]:
    """One result row per (d, memoize) configuration.

    ``small`` changes nothing: the mechanism's state and aggregate are small at any ``n``.
    """
    buckets = LinearBuckets(low=0, high=DAY, count=32)
    csprng = SystemRandom()
    values = (SeededRandom(1).words(n) % np.uint64(DAY)).astype(np.int64)
    devices = min(n, 200_000)
    singles = min(n, 50_000)
    single_values = values[:singles].tolist()
    rows: list[dict[str, Any]] = []
    for d in (1, 4):
        for memoize in (True, False):
            mech = DBitFlip(epsilon=1.0, buckets=buckets, d=d, memoize=memoize)
            rows.append(_row(mech, values, single_values, devices, csprng))
    return rows


def _row(
    mech: DBitFlip, values: npt.NDArray[np.int64], single_values: list[int], devices: int, csprng: SystemRandom
) -> dict[str, Any]:
    n = int(values.size)
    server = DBitFlipServer(mech)
    state = mech.setup(csprng)
    t_single = seconds(lambda: [mech.privatize(v, state, csprng) for v in single_values])
    states = server.setup_many(devices, csprng)
    t_setup = seconds(lambda: server.setup_many(devices, csprng))
    t_batch = seconds(lambda: server.privatize_many(values[:devices], csprng, states=states))
    batch = server.privatize_many(values, csprng)
    t_fresh = seconds(lambda: server.privatize_many(values, csprng))
    agg = server.new_aggregate()
    t_add = seconds(lambda: agg.add(batch))
    t_est = seconds(agg.estimate, repeat=3)
    wire = server.encode_batch(server.privatize_many(values[:devices], csprng, states=states))
    t_decode = seconds(lambda: server.decode_records(wire))
    return {
        "mechanism": "dbitflip",
        "params": {"epsilon": mech.epsilon, "k": mech.k, "d": mech.d, "memoize": mech.memoize},
        "n": n,
        "privatize_per_s": rate(len(single_values), t_single),
        "privatize_batch_per_s": rate(devices, t_batch),
        "privatize_fresh_batch_per_s": rate(n, t_fresh),
        "setup_per_s": rate(devices, t_setup),
        "aggregate_per_s": rate(n, t_add),
        "decode_per_s": rate(devices, t_decode),
        "estimate_s": round(t_est, 6),
    }
