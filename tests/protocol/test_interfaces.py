"""The mechanism contract: every built-in mechanism meets both halves of it, in plain forms, for its kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.interfaces import EstimateKind, Mechanism, Privatization, memos_in_plain
from protocol.randomness import SeededRandom
from protocol.registry import BUILTIN_MECHANISMS, MECHANISM_NAMES, Registry, parse_registry
from protocol.server.contract import (
    ServerMechanism,
    candidate_server,
    discovery_server,
    frequency_server,
    histogram_server,
    mean_server,
)

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
    "olh": EstimateKind.DICTIONARY,
    "grr": EstimateKind.CATEGORIES,
    "oue": EstimateKind.CATEGORIES,
    "ss": EstimateKind.CATEGORIES,
    "pgr": EstimateKind.CATEGORIES,
}
PRIVATIZATION = {
    "rr": Privatization.EVENT,
    "one-bit-mean": Privatization.COUNTER,
    "dbitflip": Privatization.COUNTER,
    "cms": Privatization.EVENT,
    "hcms": Privatization.EVENT,
    "rappor": Privatization.STRING,
    "sfp": Privatization.EVENT,
    "olh": Privatization.EVENT,
    "grr": Privatization.EVENT,
    "oue": Privatization.EVENT,
    "ss": Privatization.EVENT,
    "pgr": Privatization.EVENT,
}


def _value_for(mech: Mechanism) -> object:
    """A value the mechanism takes: its first category when it has a fixed list, else one of VALUES."""
    categories = getattr(mech, "fixed_categories", None)
    return categories[0] if categories else VALUES[mech.value_type.value]


@pytest.fixture(scope="module")
def example() -> Registry:
    """The deployed example registry: one use case per mechanism."""
    return parse_registry(EXAMPLE.read_bytes(), source=str(EXAMPLE))


def test_every_builtin_is_in_the_table_and_has_its_kind(example: Registry) -> None:
    """The twelve entries are the built-in table; each states the kind and timing docs/design.md §3.1 gives it."""
    assert [e.name for e in BUILTIN_MECHANISMS] == list(MECHANISM_NAMES)
    seen = set()
    for uc in example.use_cases.values():
        mech = uc.mechanism
        assert isinstance(mech, Mechanism)
        assert isinstance(uc.server, ServerMechanism)
        assert uc.server.mechanism is mech
        assert mech.kind is KINDS[mech.name], mech.name
        assert mech.privatization is PRIVATIZATION[mech.name], mech.name
        seen.add(mech.name)
    assert seen == set(MECHANISM_NAMES)


def test_each_kind_narrows_to_its_server_protocol_and_no_other(example: Registry) -> None:
    """mean_server / histogram_server / ... accept exactly the server halves of their kind."""
    narrow = {
        EstimateKind.PROPORTION: mean_server,
        EstimateKind.MEAN: mean_server,
        EstimateKind.HISTOGRAM: histogram_server,
        EstimateKind.DICTIONARY: frequency_server,
        EstimateKind.CATEGORIES: frequency_server,
        EstimateKind.CANDIDATES: candidate_server,
        EstimateKind.DISCOVERY: discovery_server,
    }
    for uc in example.use_cases.values():
        server = uc.server
        assert narrow[server.kind](server) is server
        for _kind, fn in narrow.items():
            if fn is not narrow[server.kind]:
                with pytest.raises(TypeError, match=uc.mechanism.name):
                    fn(server)


def test_plain_forms_round_trip_through_wire_and_aggregate(example: Registry) -> None:
    """setup_plain -> privatize_plain -> decode_records -> fold -> to_plain -> restore_aggregate."""
    rng = SeededRandom(11)
    for uc in example.use_cases.values():
        mech = uc.mechanism
        value = mech.check_value(_value_for(mech))
        if mech.privatization is Privatization.COUNTER:
            value = mech.counter_input(float(value))
        state = mech.setup_plain(rng)
        mech.check_state_plain(state)
        wire, new_state = mech.privatize_plain(value, state, rng)
        mech.check_state_plain(new_state)
        server = uc.server
        batch = server.decode_records([wire])
        assert len(batch) == 1
        agg = server.new_aggregate()
        server.fold(agg, batch)
        server.fold(agg, server.empty_batch())
        again = server.restore_aggregate(agg.to_plain())
        assert again.n == agg.n == 1
        assert agg.merge(again).n == 2
        plan = server.plan(1e6)
        assert plan.standard_error > 0
        assert plan.formulas
        assert mech.privacy_figures()["epsilon_report"] == pytest.approx(mech.epsilon_report)


def test_a_mix_up_of_mechanisms_is_a_type_error(example: Registry) -> None:
    """Folding one mechanism's batch into another's aggregate is refused by name, never folded."""
    cms, hcms = example["emoji"], example["safari-energy-domains"]
    batch = hcms.server.decode_records([hcms.mechanism.privatize_plain("x", None, SeededRandom(1))[0]])
    with pytest.raises(TypeError, match="cms"):
        cms.server.fold(cms.server.new_aggregate(), batch)


def test_memos_in_plain_counts_one_memo_per_state_or_per_value(example: Registry) -> None:
    """A memoized state is one memo, RAPPOR's one per distinct value, a stateless mechanism's none."""
    rng = SeededRandom(12)
    counted = {}
    for uc in example.use_cases.values():
        mech = uc.mechanism
        state = mech.setup_plain(rng)
        if mech.privatization is Privatization.STRING:
            assert memos_in_plain(state) == 0  # nothing memoized before the first value
            for word in ("alpha", "beta", "gamma", "beta"):
                _, state = mech.privatize_plain(mech.check_value(word), state, rng)
        counted[mech.name] = memos_in_plain(state)
    stateless = {"rr", "cms", "hcms", "sfp", "olh", "grr", "oue", "ss", "pgr"}
    assert counted == dict.fromkeys(stateless, 0) | {"one-bit-mean": 1, "dbitflip": 1, "rappor": 3}
