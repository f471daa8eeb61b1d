"""The device half of every mechanism is pure Python: importing it and privatizing with it
never loads numpy (a device carries no numpy; docs/design.md, "Two halves of a mechanism")."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Each module here is a device half (or what one needs); a split mechanism adds its own.
DEVICE_MODULES = [
    "protocol.buckets",
    "protocol.categories",
    "protocol.cms",
    "protocol.dbitflip",
    "protocol.hashing",
    "protocol.grr",
    "protocol.hcms",
    "protocol.olh",
    "protocol.one_bit_mean",
    "protocol.oue",
    "protocol.pgr",
    "protocol.randomized_response",
    "protocol.randomness",
    "protocol.rappor",
    "protocol.sfp",
    "protocol.ss",
]


@pytest.mark.parametrize("module", DEVICE_MODULES)
def test_a_device_half_loads_no_numpy(module: str) -> None:
    """Importing the module in a fresh interpreter leaves numpy unloaded."""
    code = f"import sys, {module}; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"{module} imports numpy"


# Sets up a device and privatizes one counter value with each of 1BitMean and dBitFlip (with and
# without its memo), with the OS's coins, as an agent does; prints the records and whether numpy
# was loaded.
_ONE_BIT_MEAN_AND_DBITFLIP = """
import sys
from protocol.buckets import ExponentialBuckets, LinearBuckets
from protocol.dbitflip import DBitFlip
from protocol.one_bit_mean import OneBitMean
from protocol.randomness import SystemRandom

rng = SystemRandom()
mechanisms = [
    OneBitMean(epsilon=1.0, m=21_600, gamma=0.2),
    OneBitMean(epsilon=1.0, m=86_400, s=4_320),
    DBitFlip(epsilon=1.0, buckets=LinearBuckets(low=0, high=86_400, count=32), d=4),
    DBitFlip(epsilon=1.0, buckets=ExponentialBuckets(start=60, factor=2, count=12), d=3, memoize=False),
]
for mech in mechanisms:
    state = mech.setup_plain(rng)
    value = mech.counter_input(mech.check_value(mech.parse_value("5400")))
    record, state = mech.privatize_plain(value, state, rng)
    mech.check_state_plain(state)
    print(repr(record))
print("numpy" in sys.modules)
"""


def test_one_bit_mean_and_dbitflip_privatize_without_numpy() -> None:
    """1BitMean and dBitFlip set up a device and privatize a value in a fresh interpreter; numpy stays unloaded."""
    out = subprocess.run([sys.executable, "-c", _ONE_BIT_MEAN_AND_DBITFLIP], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 5, out.stdout
    assert lines[0] in ("0", "1")
    assert lines[2].startswith("[[")
    assert lines[-1] == "False", "privatizing loaded numpy"


# Sets up a device and privatizes twice (a new value, then the memoized one) in every variant.
_RAPPOR = """
import sys
from protocol.randomness import SystemRandom
from protocol.rappor import Rappor, RapporState

rng = SystemRandom()
for variant in ("standard", "one-time", "basic", "basic-one-time"):
    basic = variant.startswith("basic")
    mech = Rappor(k=3 if basic else 64, h=1 if basic else 2, cohorts=4, f=0.5, p=0.5, q=0.75,
                  seed=b"device-half-test-seed", variant=variant, categories=("a", "b", "c") if basic else ())
    state = RapporState.from_plain(mech, mech.setup_plain(rng))
    for _ in range(2):
        record, state = mech.privatize("b", state, rng)
    mech.encode_records([record])
print("numpy" in sys.modules)
"""


def test_rappor_privatizes_without_numpy() -> None:
    """A fresh interpreter sets up RAPPOR and privatizes with it, every variant, and numpy stays unloaded."""
    out = subprocess.run([sys.executable, "-c", _RAPPOR], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# One value per sketch, privatized as the agent does (the plain form, the OS source), with sizes
# that take every branch of the coins: a power-of-two k and one that needs rejection, m not a
# multiple of 8, and SFP's two CMS reports.
_SKETCHES = """
import sys
from protocol.cms import CountMeanSketch
from protocol.hcms import HadamardCountMeanSketch
from protocol.randomness import SystemRandom
from protocol.sfp import SequenceFragmentPuzzle

seed = bytes(range(16))
rng = SystemRandom()
sketches = [
    (CountMeanSketch(epsilon=4.0, k=65_536, m=1024, seed=seed), "example.com"),
    (CountMeanSketch(epsilon=1.0, k=7, m=13, seed=seed), b"bytes"),
    (HadamardCountMeanSketch(epsilon=4.0, k=1024, m=32_768, seed=seed), "example.com"),
    (HadamardCountMeanSketch(epsilon=1.0, k=5, m=8, seed=seed), "x"),
    (
        SequenceFragmentPuzzle(
            epsilon=2.0, epsilon_fragment=6.0, k=2048, m=1024, k_fragment=2048, m_fragment=1024, seed=seed
        ),
        "bruh",
    ),
]
for mech, value in sketches:
    record, state = mech.privatize_plain(mech.check_value(value), mech.setup_plain(rng), rng)
    assert state is None and record
print("numpy" in sys.modules)
"""


def test_the_sketches_privatize_without_numpy() -> None:
    """CMS, HCMS and SFP each privatize a value in a fresh interpreter, and numpy is still not loaded."""
    out = subprocess.run([sys.executable, "-c", _SKETCHES], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", "privatizing with a sketch loads numpy"


# The frequency oracles at the local-privacy limit, at the sizes that take each branch: a large
# and a small category list, subset selection in both wire forms, PGR with t = 2 and t >= 3.
_ORACLES = """
import sys
from protocol.grr import GeneralizedRandomizedResponse
from protocol.olh import OptimalLocalHashing
from protocol.oue import OptimizedUnaryEncoding
from protocol.pgr import ProjectiveGeometryResponse
from protocol.randomness import SystemRandom
from protocol.ss import SubsetSelection

rng = SystemRandom()
big = tuple(f"c{i}" for i in range(843))
small = ("a", "b", "c")
oracles = [
    (OptimalLocalHashing(epsilon=4.0, seed=bytes(range(16))), "example.com"),
    (GeneralizedRandomizedResponse(epsilon=4.0, categories=big), "c7"),
    (OptimizedUnaryEncoding(epsilon=4.0, categories=big), "c7"),
    (SubsetSelection(epsilon=4.0, categories=big), "c7"),
    (SubsetSelection(epsilon=0.5, categories=big), "c7"),
    (ProjectiveGeometryResponse(epsilon=4.0, categories=big), "c7"),
    (ProjectiveGeometryResponse(epsilon=1.0, categories=small), "b"),
]
for mech, value in oracles:
    record, state = mech.privatize_plain(mech.check_value(value), mech.setup_plain(rng), rng)
    assert state is None and record is not None
print("numpy" in sys.modules)
"""


def test_the_frequency_oracles_privatize_without_numpy() -> None:
    """olh, grr, oue, ss and pgr each privatize a value in a fresh interpreter, and numpy is still not loaded."""
    out = subprocess.run([sys.executable, "-c", _ORACLES], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", "privatizing with a frequency oracle loads numpy"
