"""Every call the agent makes into a mechanism, asked of its contract, never of its name.

The mechanism says when it privatizes (:class:`~protocol.interfaces.Privatization`,
docs/design.md §3.3):

* ``COUNTER`` (1BitMean, dBitFlip/dBitFlipPM): recorded values add up to a running total
  per period and counter key; when the period closes the total is answered from the
  device's permanent state (000 §3.1, §3.4) and erased. The total is the only raw value the
  agent ever keeps, encrypted, and only until its period closes.
* ``STRING`` (RAPPOR): a value is privatized when recorded; the permanent response ``B'``
  is memoized in the mechanism state keyed by a keyed hash (004 §2 step 2), and each
  distinct value is reported at most once per period, so the period's report answers from
  the memo. No string is stored.
* ``EVENT`` (randomized response, CMS, HCMS, SFP): event-level privacy (003 §3.2.1): the value
  is privatized at once and only the privatized record is kept.

What a value must look like, how a typed value is parsed and what a counter's total is
privatized as are the mechanism's too (:meth:`~protocol.interfaces.Mechanism.check_value`,
``parse_value``, ``counter_input``); here they only gain the use case's name in the message.

Every call the agent makes into a mechanism goes through this module (drawing permanent
state, privatizing, the ε figures), so a change of the mechanism contract
(:class:`protocol.interfaces.Mechanism`) is met here and nowhere else in the agent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from agent.errors import ValueRefusedError
from protocol.checks import MAX_COUNTER
from protocol.errors import InputError
from protocol.interfaces import (
    EstimateKind,
    HistogramMechanism,
    Privatization,
    RecordValue,
    ValueType,
    as_discovery,
    as_frequencies,
    memos_in_plain,
)
from protocol.plain import Plain
from protocol.randomness import RandomSource
from protocol.registry import UseCase

__all__ = [
    "MAX_COUNTER",
    "ValueFacts",
    "check_counter_value",
    "check_value",
    "clamp_note",
    "coerce_text",
    "counter_input",
    "fingerprint",
    "load_permanent_state",
    "memo_charge",
    "memos_held",
    "privacy_figures",
    "privatization_of",
    "privatize",
    "setup",
    "value_facts",
]


def privatization_of(use_case: UseCase) -> Privatization:
    """When ``use_case``'s mechanism privatizes."""
    return use_case.mechanism.privatization


def fingerprint(use_case: UseCase) -> bytes:
    """A digest of the use case's mechanism parameters.

    Saved next to the permanent state: if the registry changes the parameters, the state no
    longer belongs to the mechanism and the use case stops instead of redrawing it.
    """
    return use_case.fingerprint


def load_permanent_state(use_case: UseCase, data: object) -> None:
    """Check a memoized mechanism's per-device state saved in plain form.

    Raises:
        protocol.errors.StateError: if ``data`` does not fit the mechanism.
    """
    use_case.mechanism.check_state_plain(data)


def _plain(value: object) -> Plain:
    # The contract's plain forms (permanent state, a record's wire form) are msgpack-ready data
    # by its definition (protocol.interfaces, "in plain form"): what the agent seals as it is.
    return cast("Plain", value)


def setup(use_case: UseCase, rng: RandomSource) -> Plain:
    """Draw a device's permanent state for ``use_case`` in plain form (None if its mechanism keeps none)."""
    return _plain(use_case.mechanism.setup_plain(rng))


def privatize(use_case: UseCase, value: object, state: Plain, rng: RandomSource) -> tuple[Plain, Plain]:
    """Privatize ``value`` with the device's plain ``state``: the record's wire form and the plain state to save.

    Raises:
        ValueRefusedError: the mechanism refused the value, naming the use case.
    """
    try:
        record, saved = use_case.mechanism.privatize_plain(value, state, rng)
    except InputError as e:
        raise ValueRefusedError(f"use case {use_case.name!r} ({use_case.mechanism.name}): {e}") from None
    return _plain(record), _plain(saved)


def privacy_figures(use_case: UseCase) -> Mapping[str, float]:
    """Every ε figure of ``use_case``'s mechanism by name, and the parameters a local policy bounds."""
    return use_case.mechanism.privacy_figures()


def memo_charge(use_case: UseCase) -> float:
    """What starting a new memo costs: what one memo can reveal of an unchanged value however
    many reports draw on it (the mechanism's ``epsilon_longitudinal``; 0 for a mechanism whose
    reports each compose on their own)."""
    return float(privacy_figures(use_case).get("epsilon_longitudinal", 0.0))


def memos_held(permanent: Mapping[bytes, Plain]) -> int:
    """How many memos a use case's permanent states hold: one per counter key for 1BitMean and
    dBitFlipPM (each key its own α and memo bits, or buckets and ``f_d``; 000 §3.1, §3.4), one
    per distinct value for RAPPOR (its ``B'``, 004 §2). Each one redrawn is charged
    :func:`memo_charge` (docs/privacy-accounting.md, "Registry changes"). Read from the states'
    plain layout, so it needs neither the parameters they were drawn under nor a registry that
    still has the use case."""
    return sum(memos_in_plain(state) for state in permanent.values())


def _refused(use_case: UseCase, exc: InputError) -> ValueRefusedError:
    # The mechanism's message completes the sentence (protocol.checks): "counts numbers; got 'x'".
    return ValueRefusedError(f"use case {use_case.name!r} ({use_case.mechanism.name}) {exc}")


def check_value(use_case: UseCase, value: object) -> RecordValue:
    """Validate and coerce one recorded value as the mechanism takes it.

    Raises:
        ValueRefusedError: naming the use case, what was expected and what was found.
    """
    try:
        return use_case.mechanism.check_value(value)
    except InputError as exc:
        raise _refused(use_case, exc) from None


def check_counter_value(use_case: UseCase, value: object) -> int | float:
    """Validate one recorded increment of a counter use case.

    Every counter use case takes increments in ``[0, 2**53]`` (1BitMean integers, dBitFlip any
    finite number; :mod:`protocol.checks`) and follows one rule beyond its mechanism's range:
    **the period's total is clamped** into it when the period is privatized (1BitMean to ``m``
    by ``counter_input``, as 000 §1.1 bounds counters by ``m``; dBitFlip into its last bucket,
    the published bucketing of :mod:`protocol.buckets`). :func:`clamp_note` says when a value
    reaches beyond the range.

    Raises:
        ValueRefusedError: naming the use case, what was expected and what was found.
    """
    checked = check_value(use_case, value)
    if isinstance(checked, str | bytes):
        raise ValueRefusedError(f"use case {use_case.name!r} ({use_case.mechanism.name}) is not a counter")
    return checked


def clamp_note(use_case: UseCase, value: int | float) -> str | None:
    """What the clamping rule of :func:`check_counter_value` does to ``value``, or None within the range."""
    mech = use_case.mechanism
    clipped = mech.counter_input(value)
    if clipped != value:
        return f"{value!r} is above the range {_range(mech.value_range)}: the period's total is clamped to {clipped!r}"
    edges = _bucket_edges(use_case)
    if edges is not None and math.isfinite(edges[-1]) and value >= edges[-1]:
        return (
            f"{value!r} is beyond the last bucket [{edges[-2]:g}, {edges[-1]:g}): "
            "the period's total is counted in the last bucket"
        )
    return None


_BUCKET_EDGES: dict[bytes, tuple[float, ...] | None] = {}


def _bucket_edges(use_case: UseCase) -> tuple[float, ...] | None:
    """A histogram mechanism's bucket edges (None for any other), looked up once per definition:
    the runtime protocol check costs tens of microseconds, and this runs for every counter value."""
    key = use_case.definition
    if key not in _BUCKET_EDGES:
        mech = use_case.mechanism
        _BUCKET_EDGES[key] = tuple(mech.bucket_edges) if isinstance(mech, HistogramMechanism) else None
    return _BUCKET_EDGES[key]


def _range(bounds: tuple[float, float] | None) -> str:
    return "of the mechanism" if bounds is None else f"[{bounds[0]:g}, {bounds[1]:g}]"


def counter_input(use_case: UseCase, total: int | float) -> RecordValue:
    """The value a counter's period total is privatized as (the mechanism may clip it, 000 §1.1)."""
    try:
        return use_case.mechanism.counter_input(total)
    except InputError as exc:
        raise _refused(use_case, exc) from None


def coerce_text(use_case: UseCase, text: str) -> object:
    """Turn a value typed on the command line into the type ``use_case`` records.

    Raises:
        ValueRefusedError: if the text is not a value of that type.
    """
    try:
        return use_case.mechanism.parse_value(text)
    except InputError as exc:
        raise _refused(use_case, exc) from None


@dataclass(frozen=True, slots=True)
class ValueFacts:
    """What an application hands a use case, as its mechanism says (what ``ldp-agent generate`` types).

    Attributes:
        mechanism: the mechanism's registry name (for people: the generated documentation).
        value_type: a bit, a count, a number or a string.
        categories: the fixed categories the string must be one of, or None.
        counter: the values add up to a period's total per counter key.
        value_range: the closed range of a number, or None.
        alphabet: the characters a discovered string may hold, or None.
    """

    mechanism: str
    value_type: ValueType
    categories: tuple[str, ...] | None
    counter: bool
    value_range: tuple[float, float] | None
    alphabet: str | None


def value_facts(use_case: UseCase) -> ValueFacts:
    """The facts of what ``use_case`` records, asked of its mechanism's contract (never of its name)."""
    mech = use_case.mechanism
    categories = as_frequencies(mech).fixed_categories if mech.kind is EstimateKind.CATEGORIES else None
    alphabet = as_discovery(mech).alphabet if mech.kind is EstimateKind.DISCOVERY else None
    return ValueFacts(
        mechanism=mech.name,
        value_type=mech.value_type,
        categories=tuple(categories) if categories else None,
        counter=mech.privatization is Privatization.COUNTER,
        value_range=mech.value_range,
        alphabet=alphabet,
    )
