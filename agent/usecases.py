"""How the agent treats each mechanism: when it privatizes, what a value must look like.

Three kinds (DESIGN "When to privatize"):

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
"""

from __future__ import annotations

import enum
import importlib
import math
from typing import Any

from agent.errors import ValueRefusedError
from protocol.registry import UseCase

__all__ = [
    "Kind",
    "check_counter_value",
    "coerce_text",
    "counter_input",
    "fingerprint",
    "kind_of",
    "load_permanent_state",
]


class Kind(enum.Enum):
    """When a use case privatizes."""

    COUNTER = "counter"
    STRING = "string"
    EVENT = "event"


_KINDS = {
    "one-bit-mean": Kind.COUNTER,
    "dbitflip": Kind.COUNTER,
    "rappor": Kind.STRING,
    "rr": Kind.EVENT,
    "cms": Kind.EVENT,
    "hcms": Kind.EVENT,
    "sfp": Kind.EVENT,
}

# The class that restores each memoized mechanism's per-device state.
_STATE_CLASSES = {
    "one-bit-mean": ("protocol.one_bit_mean", "OneBitMeanState"),
    "dbitflip": ("protocol.dbitflip", "DBitFlipState"),
    "rappor": ("protocol.rappor", "RapporState"),
}

MAX_COUNTER = float(1 << 53)
"""Largest counter total the agent keeps (beyond it floats lose integers)."""


def kind_of(use_case: UseCase) -> Kind:
    """The kind of ``use_case``'s mechanism.

    Raises:
        ValueError: for a mechanism the agent does not know.
    """
    try:
        return _KINDS[use_case.mechanism.name]
    except KeyError:
        raise ValueError(
            f"use case {use_case.name!r}: the agent cannot run mechanism {use_case.mechanism.name!r}"
        ) from None


def fingerprint(use_case: UseCase) -> bytes:
    """A digest of the use case's mechanism parameters.

    Saved next to the permanent state: if the registry changes the parameters, the state no
    longer belongs to the mechanism and the use case stops instead of redrawing it.
    """
    return use_case.fingerprint


def load_permanent_state(use_case: UseCase, data: object) -> Any:
    """Restore a memoized mechanism's per-device state saved with ``state.to_plain()``.

    Raises:
        protocol.errors.StateError: if ``data`` does not fit the mechanism.
    """
    module, cls = _STATE_CLASSES[use_case.mechanism.name]
    return getattr(importlib.import_module(module), cls).from_plain(use_case.mechanism, data)


def check_counter_value(use_case: UseCase, value: object) -> int | float:
    """Validate one recorded increment of a counter use case.

    1BitMean counts integers in ``[0, m]`` (000 §2.1); dBitFlip buckets any finite
    non-negative number (000 §2.2).

    Raises:
        ValueRefusedError: naming the use case, what was expected and what was found.
    """
    mech: Any = use_case.mechanism
    if mech.name == "one-bit-mean":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueRefusedError(
                f"use case {use_case.name!r} (one-bit-mean) counts integers in [0, {mech.m}]; got {value!r}"
            )
        if not 0 <= value <= mech.m:
            raise ValueRefusedError(
                f"use case {use_case.name!r} (one-bit-mean): value must be in [0, {mech.m}]; got {value}"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueRefusedError(f"use case {use_case.name!r} ({mech.name}) counts numbers; got {value!r}")
    if not math.isfinite(value) or value < 0 or value > MAX_COUNTER:
        raise ValueRefusedError(
            f"use case {use_case.name!r} ({mech.name}): value must be a finite number in [0, 2**53]; got {value!r}"
        )
    return value


def counter_input(use_case: UseCase, total: int | float) -> int | float:
    """The value a counter's period total is privatized as.

    1BitMean's range is ``[0, m]``: a total above ``m`` (several increments in one period) is
    clipped to ``m``, as 000 §1.1 assumes counters bounded by ``m``. dBitFlip clamps into
    its last bucket itself.
    """
    mech: Any = use_case.mechanism
    if mech.name == "one-bit-mean":
        return min(int(total), int(mech.m))
    return total


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def coerce_text(use_case: UseCase, text: str) -> object:
    """Turn a value typed on the command line into the type ``use_case`` records.

    Counters take numbers, randomized response a bit (``0``/``1``/``true``/``false``),
    everything else the text itself.

    Raises:
        ValueRefusedError: if the text is not a value of that type.
    """
    kind = kind_of(use_case)
    name = use_case.mechanism.name
    if kind is Kind.COUNTER:
        try:
            return int(text)
        except ValueError:
            pass
        if name != "one-bit-mean":
            try:
                return float(text)
            except ValueError:
                pass
        raise ValueRefusedError(f"use case {use_case.name!r} ({name}) counts numbers; got {text!r}")
    if name == "rr":
        low = text.strip().lower()
        if low in _TRUE:
            return 1
        if low in _FALSE:
            return 0
        raise ValueRefusedError(f"use case {use_case.name!r} (rr) takes 0/1 or true/false; got {text!r}")
    return text
