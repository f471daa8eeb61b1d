"""The on-device agent: consent, sources, privatization, encrypted state, limits, schedule, publish.

Values from applications (Unix socket, ``ldp-agent record``) and built-in probes are
privatized on the device with the use case's local-DP mechanism from :mod:`protocol`; the
permanent randomness, open periods, accounting and outbox live in AES-GCM-sealed files; a
collection cycle every 6 hours (UTC-aligned, jittered) closes periods, samples within the
daily limit and the lifetime ε cap, and stages msgpack reports, which an MQTT publisher
sends with QoS 1 and removes only once the broker acknowledged them.

Modules: ``config`` (TOML), ``errors``, ``sealed`` (AES-GCM files), ``state`` (sealed
documents; ``plain_copy`` copies their contents), ``plain`` (the types of msgpack and JSON
data), ``accounting`` (daily limit, ε cap), ``usecases`` (per-mechanism rules, the one
caller of the mechanisms), ``policy`` (local caps), ``core`` (the agent, one object over its
jobs: ``statefiles`` (the state directory's files, each read and written on its own),
``device_state`` (the state in memory, frozen), ``loading`` (the files checked against the
manifest), ``transaction`` (a step's change and its one commit), ``recording``, ``collection``,
``outbox`` (outbox, ledger, receipts), ``registry_change``, ``re_enrolment``, ``expiry``, ``status``),
``probes``, ``api`` (Unix socket), ``transport`` and ``mqtt`` (publishing), ``publisher``,
``schedule``, ``daemon``, ``cli``. For applications: ``client`` (the socket's client, standard
library only) and ``generate`` (``ldp-agent generate``: typed code per use case, from ``codegen``,
``codegen_python`` and ``codegen_c``). The clock and sd_notify are :mod:`runtime`'s, shared with the
collector.
"""

__all__ = [
    "accounting",
    "api",
    "cli",
    "client",
    "codegen",
    "codegen_c",
    "codegen_python",
    "collection",
    "config",
    "core",
    "daemon",
    "device_state",
    "errors",
    "expiry",
    "generate",
    "loading",
    "mqtt",
    "outbox",
    "plain",
    "plain_copy",
    "policy",
    "probes",
    "publisher",
    "re_enrolment",
    "recording",
    "registry_change",
    "schedule",
    "sealed",
    "state",
    "statefiles",
    "status",
    "transaction",
    "transport",
    "usecases",
]
