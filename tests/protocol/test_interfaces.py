"""The mechanism contract: every built-in mechanism meets it, in plain forms, for its kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.interfaces import (
    EstimateKind,
    Mechanism,
    Privatization,
    as_candidates,
    as_discovery,
    as_frequencies,
    as_histogram,
    as_mean,
    mechanism_entries,
)
from protocol.randomness import SeededRandom
from protocol.registry import MECHANISM_NAMES, Registry, parse_registry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "usecases.example.toml"

# A value each kind of use case in the example records.
VALUES = {"bit": 1, "count": 600, "number": 125.5, "string": "hello"}

KINDS = {
    "rr": EstimateKind.PROPORTION,
    "one-bit-mean": EstimateKind.MEAN,
    "dbitflip": EstimateKind.HISTOGRAM,
    "cms": EstimateKind.DICTIONARY,
    "hcms": EstimateKind.DICTIONARY,
    "rappor": EstimateKind.CANDIDATES,
    "sfp": EstimateKind.DISCOVERY,
}
PRIVATIZATION = {
    "rr": Privatization.EVENT,
    "one-bit-mean": Privatization.COUNTER,
    "dbitflip": Privatization.COUNTER,
    "cms": Privatization.EVENT,
    "hcms": Privatization.EVENT,
    "rappor": Privatization.STRING,
    "sfp": Privatization.EVENT,
}


@pytest.fixture(scope="module")
def example() -> Registry:
    """The deployed example registry: one use case per mechanism."""
    return parse_registry(EXAMPLE.read_bytes(), source=str(EXAMPLE))


def test_every_builtin_is_in_the_table_and_has_its_kind(example: Registry) -> None:
    """The seven modules registered themselves; each states the kind and timing DESIGN gives it."""
    assert set(MECHANISM_NAMES) <= set(mechanism_entries())
    seen = set()
    for uc in example.use_cases.values():
        mech = uc.mechanism
        assert isinstance(mech, Mechanism)
        assert mech.kind is KINDS[mech.name], mech.name
        assert mech.privatization is PRIVATIZATION[mech.name], mech.name
        seen.add(mech.name)
    assert seen == set(MECHANISM_NAMES)


def test_each_kind_narrows_to_its_protocol_and_no_other(example: Registry) -> None:
    """as_mean / as_histogram / ... accept exactly the mechanisms of their kind."""
    narrow = {
        EstimateKind.PROPORTION: as_mean,
        EstimateKind.MEAN: as_mean,
        EstimateKind.HISTOGRAM: as_histogram,
        EstimateKind.DICTIONARY: as_frequencies,
        EstimateKind.CATEGORIES: as_frequencies,
        EstimateKind.CANDIDATES: as_candidates,
        EstimateKind.DISCOVERY: as_discovery,
    }
    for uc in example.use_cases.values():
        mech = uc.mechanism
        assert narrow[mech.kind](mech) is mech
        for _kind, fn in narrow.items():
            if fn is not narrow[mech.kind]:
                with pytest.raises(TypeError, match=mech.name):
                    fn(mech)


def test_plain_forms_round_trip_through_wire_and_aggregate(example: Registry) -> None:
    """setup_plain -> privatize_plain -> decode_records -> fold -> to_plain -> restore_aggregate."""
    rng = SeededRandom(11)
    for uc in example.use_cases.values():
        mech = uc.mechanism
        value = mech.check_value(VALUES[mech.value_type.value])
        if mech.privatization is Privatization.COUNTER:
            value = mech.counter_input(float(value))
        state = mech.setup_plain(rng)
        mech.check_state_plain(state)
        wire, new_state = mech.privatize_plain(value, state, rng)
        mech.check_state_plain(new_state)
        batch = mech.decode_records([wire])
        assert len(batch) == 1
        agg = mech.new_aggregate()
        mech.fold(agg, batch)
        mech.fold(agg, mech.empty_batch())
        again = mech.restore_aggregate(agg.to_plain())
        assert again.n == agg.n == 1
        assert agg.merge(again).n == 2
        plan = mech.plan(1e6)
        assert plan.standard_error > 0
        assert plan.formulas
        assert mech.privacy_figures()["epsilon_report"] == pytest.approx(mech.epsilon_report)


def test_a_mix_up_of_mechanisms_is_a_type_error(example: Registry) -> None:
    """Folding one mechanism's batch into another's aggregate is refused by name, never folded."""
    cms, hcms = example["emoji"].mechanism, example["safari-energy-domains"].mechanism
    batch = hcms.decode_records([hcms.privatize_plain("x", None, SeededRandom(1))[0]])
    with pytest.raises(TypeError, match="cms"):
        cms.fold(cms.new_aggregate(), batch)
