"""The device's pure path and the batch path draw from one distribution, the exact one.

Each mechanism's own tests show the two paths give the same records from the same words (the
pure path is what a device runs without numpy; the batch path is the simulator's). Here they
run on *different* seeded streams, as a device and the simulator do, and both are held to the
mechanism's exact output probability: fresh devices (permanent state drawn per device, for
1BitMean) each report once, and the count of ones on each path lies within 5 standard errors
of ``n·p`` for the exact ``p`` of ``output_distribution``, as does the difference of the two
counts within 5 standard errors of a difference of two such counts. Seeded: deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from protocol.one_bit_mean import OneBitMean
from protocol.randomized_response import RandomizedResponse
from protocol.randomness import SeededRandom
from protocol.server.one_bit_mean import OneBitMeanServer
from protocol.server.randomized_response import RRServer

N = 20_000


def _assert_same_exact_distribution(pure_ones: int, batch_ones: int, p: float) -> None:
    se = math.sqrt(N * p * (1 - p))
    assert abs(pure_ones - N * p) <= 5 * se, (pure_ones, N * p)
    assert abs(batch_ones - N * p) <= 5 * se, (batch_ones, N * p)
    assert abs(pure_ones - batch_ones) <= 5 * math.sqrt(2) * se, (pure_ones, batch_ones)


@pytest.mark.parametrize(("x", "gamma"), [(0, 0.0), (97, 0.2), (240, 0.0)])
def test_one_bit_mean_fresh_devices(x: int, gamma: float) -> None:
    """α-point rounding, the memo and output perturbation, drawn per device on both paths."""
    mech = OneBitMean(epsilon=1.0, m=240, s=12, gamma=gamma)
    pure = SeededRandom(1)
    pure_ones = sum(mech.privatize(x, mech.setup(pure), pure)[0].bit for _ in range(N))
    server, batch = OneBitMeanServer(mech), SeededRandom(2)
    states = server.setup_many(N, batch)
    batch_ones = int(server.privatize_many(np.full(N, x, dtype=np.int64), states, batch).bits.sum())
    _assert_same_exact_distribution(pure_ones, batch_ones, float(mech.output_distribution(x)[1]))


@pytest.mark.parametrize("bit", [0, 1])
def test_randomized_response(bit: int) -> None:
    mech = RandomizedResponse(epsilon=1.0986)
    pure = SeededRandom(3)
    pure_ones = sum(mech.privatize(bit, None, pure)[0].bit for _ in range(N))
    batch = RRServer(mech).privatize_many(np.full(N, bit, dtype=np.uint8), SeededRandom(4))
    _assert_same_exact_distribution(pure_ones, int(batch.bits.sum()), float(mech.output_distribution(bit)[1]))
