"""The server half of every mechanism: what the collector and the simulator run (numpy).

A mechanism is two halves (``docs/design.md``, "Mechanisms"). Its parameters and its device
half (set up state, privatize, the record's wire form) live in the mechanism's module of
``protocol/`` and import no numpy, so a device installs none. Its server half lives here, in a
module of the same name: decoding records into a columnar batch, folding batches into a
mergeable aggregate, the estimators with their standard errors, the planner's formulas and
the vectorised privatizers the simulator and the benchmarks use.
:mod:`protocol.server.contract` is the server half's contract and the generic base that holds
its plain-form plumbing once; :func:`~protocol.server.contract.server_of` gives a mechanism's
server half (what ``UseCase.server`` returns).
"""
