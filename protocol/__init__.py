"""The contract agent and collector share: pure mechanisms, hashing, wire format, registry.

Bytes and frozen values in, bytes and frozen values out: nothing here touches files,
sockets, clocks or the event loop. A mechanism has two halves: its device half here
(``protocol/<mechanism>.py``: parameters, setup, privatize, the record's wire form; pure
Python, so a device installs no numpy) and its server half in :mod:`protocol.server`
(decode, aggregate, estimate, plan; numpy). Each device half names its server half, and the
two are tested against each other, because an estimator is only correct for the exact
randomizer it inverts (docs/design.md, "Two halves of a mechanism").
"""

__all__ = [
    "buckets",
    "catalog",
    "checks",
    "cms",
    "dbitflip",
    "envelope",
    "errors",
    "hashing",
    "hcms",
    "interfaces",
    "one_bit_mean",
    "randomized_response",
    "randomness",
    "rappor",
    "receipts",
    "registry",
    "schema",
    "server",
    "sfp",
    "use_cases",
    "wire",
]
