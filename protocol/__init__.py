"""The contract agent and collector share: pure mechanisms, hashing, wire format, registry.

Bytes and frozen values in, bytes and frozen values out: nothing here touches files,
sockets, clocks or the event loop. Each mechanism module holds its client half (what a
device runs) next to its server half (what the collector runs), because an estimator is
only correct for the exact randomizer it inverts.
"""

__all__ = [
    "bit_sum",
    "buckets",
    "checks",
    "cms",
    "dbitflip",
    "errors",
    "estimate",
    "exit_status",
    "hashing",
    "hcms",
    "interfaces",
    "one_bit_mean",
    "plain",
    "randomized_response",
    "randomness",
    "rappor",
    "registry",
    "sfp",
    "sketch",
    "wire",
]
